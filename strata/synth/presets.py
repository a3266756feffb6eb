"""The named shapes `strata synth --preset` scales down, and the routing recipe's skew for them.

Plain data with no imports, so `strata synth --help` lists the presets without loading numpy.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A real model's shape, the source of a scaled-down synthetic one."""
    arch: str
    n_layers: int
    n_experts: int
    top_k: int
    hidden: int
    ff: int
    n_head: int
    n_head_kv: int
    vocab: int
    note: str


#: Named full-size shapes. The synthetic files keep expert count, top-k, the ratio of expert to
#: resident bytes and the FFN-to-hidden ratio, and scale layers and widths down to the size asked.
PRESETS: dict[str, Preset] = {
    "moe-125b": Preset("qwen3moe", 48, 32, 2, 6144, 4096, 48, 8, 32000,
                       "a 125B-class MoE (~117B): 32 experts per layer, 2 routed per token"),
    "mixtral-like": Preset("llama", 56, 8, 2, 6144, 16384, 48, 8, 32768, "Mixtral-8x22B's shape (141B)"),
    "qwen3-235b-like": Preset("qwen3moe", 94, 128, 8, 4096, 1536, 64, 4, 151936, "Qwen3-235B-A22B's shape"),
    "deepseek-v3-like": Preset("qwen3moe", 61, 256, 8, 7168, 2048, 128, 8, 129280,
                               "DeepSeek-V3's expert shape (256 experts, top-8, 671B) in a qwen3moe file: "
                               "expert count, widths and byte shares, not its MLA attention"),
}

#: The recipe's popularity exponent for presets (see the module docstring and README's figures).
ROUTER_SKEW = 0.1

__all__ = ["PRESETS", "ROUTER_SKEW", "Preset"]
