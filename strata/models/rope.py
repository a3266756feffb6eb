"""Rotary position embedding in ggml's two arrangements, with the context-extension scalings.

NORM (llama.cpp's LLAMA_ROPE_TYPE_NORM) rotates adjacent pairs (x[2i], x[2i+1]); NEOX rotates
x[i] with x[i + n/2]. Both rotate the first `rope_dim` features of each head and pass the rest
through. Pair i turns by position * theta_i with theta_i = base^(-2i / rope_dim) / ff_i (ff: the
file's frequency factors, `rope_freqs` or longrope's long/short set; 1 without), adjusted by the
scaling the file declares:

  linear    theta_i / factor (position interpolation);
  yarn      per pair, a blend of interpolated and original theta by a linear ramp between two
            correction dimensions from beta_fast / beta_slow, times ext_factor (the formula of
            the YaRN paper as ggml's `rope_yarn` applies it, which is also what transformers'
            "yarn" computes), cos/sin scaled by 1 + 0.1 ln factor (transformers' attention
            factor; `yarn_attn_factor` replaces it when the file gives one, as transformers'
            `attention_factor` does); DeepSeek's form (deepseek2 with yarn_log_multiplier)
            leaves cos/sin unscaled and scales the attention instead (strata.models.mla);
  longrope  only the factors: the long set when the context exceeds the original one.

cos/sin are then multiplied by `rope.scaling.attn_factor` for every type, as llama.cpp's
rope_attn_factor is. Angles are computed in float32 from float32 inverse frequencies, as
transformers does.
Must not: read files; the frequencies and factors come from HParams and the loader.
"""
from __future__ import annotations

import math

import torch

from strata.errors import StrataFormatError
from strata.gguf import HParams

YARN_BETA_FAST = 32.0  # llama.cpp's defaults when rope.scaling.yarn_beta_* are absent
YARN_BETA_SLOW = 1.0


def _yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def _yarn(inv_freq: torch.Tensor, hp: HParams, base: float) -> tuple[torch.Tensor, float]:
    s, n_dims = hp.rope_scaling, hp.rope_dim
    fast = s.yarn_beta_fast if s.yarn_beta_fast is not None else YARN_BETA_FAST
    slow = s.yarn_beta_slow if s.yarn_beta_slow is not None else YARN_BETA_SLOW
    ext_factor = s.yarn_ext_factor if s.yarn_ext_factor is not None and s.yarn_ext_factor >= 0 else 1.0
    low = max(0.0, math.floor(_yarn_corr_dim(n_dims, s.original_context_length, fast, base)))
    high = min(n_dims - 1.0, math.ceil(_yarn_corr_dim(n_dims, s.original_context_length, slow, base)))
    i = torch.arange(n_dims // 2, dtype=torch.float32)
    mix = (1 - ((i - low) / max(0.001, high - low)).clamp(0, 1)) * ext_factor  # [rope_dim/2]
    inv_freq = inv_freq / s.factor * (1 - mix) + inv_freq * mix
    if s.yarn_attn_factor is not None:
        return inv_freq, s.yarn_attn_factor
    if s.yarn_log_multiplier and hp.kv_lora_rank:
        # deepseek2 (mscale_all_dim written as 0.1 * it): llama.cpp takes mscale = mscale_all_dim, so
        # cos/sin keep get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) = 1 (transformers' attention
        # factor); the mscale^2 goes into the attention scale instead (strata.models.mla.mla_scale)
        return inv_freq, 1.0
    return inv_freq, 1.0 + 0.1 * math.log(s.factor) if ext_factor != 0 and s.factor > 1.0 else 1.0


def rope_frequencies(hp: HParams, freq_factors: torch.Tensor | None = None,
                     base: float | None = None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rope_dim/2] float32, cos/sin scale) of a model's RoPE, at `base`
    (hp.rope_freq_base unless given), divided by `freq_factors` [rope_dim/2] when given."""
    dim, base = hp.rope_dim, base or hp.rope_freq_base
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float().cpu()
    kind, s = hp.rope_scaling.type, hp.rope_scaling
    attn_factor = s.attn_factor if s.attn_factor is not None else 1.0
    if kind in ("none", "longrope") or (kind == "linear" and s.factor == 1.0):
        return inv_freq, attn_factor
    if kind == "linear":
        return inv_freq / s.factor, attn_factor
    if kind == "yarn":
        inv_freq, scale = _yarn(inv_freq, hp, base)
        return inv_freq, scale * attn_factor
    raise StrataFormatError(f"{hp.arch}: rope scaling type {kind!r} is not supported "
                            "(expected none, linear, yarn or longrope)")


class Rope:
    """cos/sin tables for given positions and their application to queries and keys."""

    def __init__(self, hp: HParams, device: torch.device, freq_factors: torch.Tensor | None = None,
                 base: float | None = None):
        inv_freq, self.scale = rope_frequencies(hp, freq_factors, base)
        self.inv_freq = inv_freq.to(device)  # [R/2], R = rope_dim
        self.neox = hp.rope_type == "neox"
        self.rope_dim = hp.rope_dim
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                upto: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, R/2] (times the scale) of `positions` [T] in `dtype`: rows of a table kept per
        dtype, computed once for positions 0..2^k-1 (grown when a position reaches past it), so a decode
        step indexes rather than computes, and a position's values never depend on the positions asked
        with it. `upto`: the largest position + 1, when the caller knows it (else read from positions)."""
        upto = int(positions.max()) + 1 if upto is None else upto
        table = self._tables.get(dtype)
        if table is None or table[0].shape[0] < upto:
            n = 1 << max(upto - 1, 255).bit_length()  # a power of two >= upto, at least 256
            angles = torch.arange(n, device=self.inv_freq.device).float()[:, None] * self.inv_freq[None, :]
            table = self._tables[dtype] = ((angles.cos() * self.scale).to(dtype), (angles.sin() * self.scale).to(dtype))
        return table[0][positions], table[1][positions]

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H, hd] rotated by cos/sin [T, R/2]; features past R pass through."""
        rot, rest = x[..., :self.rope_dim], x[..., self.rope_dim:]
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, R/2]
        if self.neox:
            x1, x2 = rot.chunk(2, dim=-1)  # [T, H, R/2] each: the two halves
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]  # [T, H, R/2] each: even and odd features
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


__all__ = ["Rope", "rope_frequencies"]
