"""The architecture registry: one file per architecture, one `Arch` record in each.

    from strata import arch
    arch.get("qwen3moe").qk_norm          # 'head'
    arch.for_hf("MixtralForCausalLM").name  # 'llama'

Left of every other package (strata.gguf reads it): gguf-py constants only, no torch, no files.
Adding an architecture is adding a module here that calls `register(Arch(...))` and importing
it below; `names` formats and parses GGUF tensor names for everyone.
"""
from . import deepseek2, gpt_oss, llama, olmoe, qwen2moe, qwen3moe  # noqa: F401  (each registers itself)
from .names import WEIGHT_SUFFIX, layer_of, weight_name, weight_pattern
from .registry import Arch, for_hf, get, hf_names, names, register, unregister

__all__ = ["WEIGHT_SUFFIX", "Arch", "for_hf", "get", "hf_names", "layer_of", "names", "register", "unregister",
           "weight_name", "weight_pattern"]
