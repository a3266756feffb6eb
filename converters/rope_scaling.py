"""RoPE context extension from a checkpoint's config to GGUF keys and tensors, as llama.cpp's
convert_hf_to_gguf.py writes them.

config.json's `rope_parameters` (transformers 5) or `rope_scaling` (older) of type:

  linear     rope.scaling.type linear, .factor;
  yarn       type yarn, .factor, .original_context_length, and when given .yarn_ext_factor
             (extrapolation_factor), .yarn_attn_factor (attention_factor), .yarn_beta_fast/_slow;
             DeepSeek's mscale_all_dim is the deepseek2 converter's (yarn_log_multiplier);
  longrope   type longrope, .original_context_length, .attn_factor (the config's attention_factor,
             else transformers' default sqrt(1 + ln(max_pos / original) / ln(original))), and the
             factor tensors `rope_factors_long` / `rope_factors_short` [head_dim/2];
  llama3     no type key: the tensor `rope_freqs` [head_dim/2] of per-pair divisors.
longrope and llama3 only for architectures whose llama.cpp graph divides by those factors (the
`Arch.rope_factors` records: llama, llama4, ...).

Other types, and longrope / llama3 where llama.cpp's graph would ignore them, are refused.
"""
from __future__ import annotations

import math
from typing import Any

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT

from converters.source import ConversionError


def rope_kind(rp: dict[str, Any]) -> str | None:
    """The scaling type of a rope_parameters dict; None for plain RoPE."""
    kind = rp.get("rope_type", rp.get("type"))
    return None if kind in (None, "default") else str(kind)


def write_rope_scaling(w: gguf.GGUFWriter, rp: dict[str, Any], cfg: dict[str, Any], arch, where: str) -> None:
    """The rope.scaling.* keys of `rp` (see the module docstring) for the `strata.arch` record
    `arch`; `where` names config.json in errors."""
    kind = rope_kind(rp)
    if kind is None:
        return
    factor = rp.get("factor")
    if kind in ("linear", "yarn") and factor is None:
        return  # as llama.cpp's converter: a type without a factor scales nothing
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(_positive(factor, "factor", where))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(_positive(factor, "factor", where))
        w.add_rope_scaling_orig_ctx_len(original_context(rp, cfg, where))
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rp.get(key) is not None:
                add(float(rp[key]))
        attention = rp.get("attention_factor", rp.get("attn_factor"))
        if attention is not None:
            w.add_rope_scaling_yarn_attn_factor(_positive(attention, "attention_factor", where))
    elif kind in ("longrope", "su"):
        _reads_factors(arch, kind, where)
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        w.add_rope_scaling_orig_ctx_len(original_context(rp, cfg, where))
        w.add_rope_scaling_attn_factors(longrope_attention(rp, cfg, where))
    elif kind == "llama3":
        _reads_factors(arch, kind, where)
    else:
        raise ConversionError(f"{where}: rope scaling type {kind!r} is not supported "
                              "(supported: linear, yarn, longrope, llama3)")


def rope_factor_tensors(rp: dict[str, Any], cfg: dict[str, Any], head_dim: int, base: float,
                        where: str) -> dict[MT, np.ndarray]:
    """The float32 factor tensors [head_dim/2] the scaling needs (longrope, llama3), by kind."""
    kind, n = rope_kind(rp), head_dim // 2
    if kind in ("longrope", "su"):
        out = {}
        for key, mt in (("long_factor", MT.ROPE_FACTORS_LONG), ("short_factor", MT.ROPE_FACTORS_SHORT)):
            values = np.asarray(rp.get(key) or [], dtype=np.float32)
            if values.shape != (n,) or not np.all(np.isfinite(values) & (values > 0)):
                raise ConversionError(f"{where}: rope_scaling {key}: expected {n} positive numbers (head_dim/2), "
                                      f"found {values.shape[0]}")
            out[mt] = values
        return out
    if kind == "llama3":
        return {MT.ROPE_FREQS: llama3_factors(rp, head_dim, base, where)}
    return {}


def llama3_factors(rp: dict[str, Any], head_dim: int, base: float, where: str) -> np.ndarray:
    """Llama 3's per-pair divisors: 1 for short wavelengths, `factor` for long ones, a smooth blend
    between (the values llama.cpp's converter writes as rope_freqs)."""
    factor = _positive(rp.get("factor"), "factor", where)
    low, high = float(rp.get("low_freq_factor", 1.0)), float(rp.get("high_freq_factor", 4.0))
    old = float(rp.get("original_max_position_embeddings", 8192))
    if not 0 < low < high:
        raise ConversionError(f"{where}: rope_scaling low_freq_factor {low} and high_freq_factor {high}: "
                              "expected 0 < low < high")
    inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (old / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid)).astype(np.float32)


def original_context(rp: dict[str, Any], cfg: dict[str, Any], where: str) -> int:
    value = rp.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    return int(_positive(value, "original_max_position_embeddings", where))


def longrope_attention(rp: dict[str, Any], cfg: dict[str, Any], where: str) -> float:
    """transformers' longrope attention factor: the config's, else from the context ratio."""
    if rp.get("attention_factor") is not None:
        return _positive(rp["attention_factor"], "attention_factor", where)
    orig = original_context(rp, cfg, where)
    factor = cfg["max_position_embeddings"] / orig if cfg.get("max_position_embeddings") else float(rp.get("factor", 1.0))
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))


def _reads_factors(arch, kind: str, where: str) -> None:
    if not arch.rope_factors:
        raise ConversionError(f"{where}: rope scaling type {kind!r} is not supported for GGUF {arch.name} "
                              "(llama.cpp's graph for it does not read RoPE factors)")


def _positive(value: Any, key: str, where: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ConversionError(f"{where}: rope_scaling {key}: expected a number > 0, found {value!r}")
    return v


__all__ = ["llama3_factors", "longrope_attention", "original_context", "rope_factor_tensors", "rope_kind",
           "write_rope_scaling"]
