"""The architecture registry: one file per architecture, one `Arch` record in each.

    from strata import arch
    arch.get("qwen3moe").qk_norm          # 'head'
    arch.for_hf("MixtralForCausalLM").name  # 'llama'

Left of every other package (strata.gguf reads it): gguf-py constants only, no torch, no files.
Adding an architecture is adding a module here that calls `register(Arch(...))`: every module
of this package but `registry` and `tensor_names` is imported below, in name order.
`tensor_names` formats and parses GGUF tensor names for everyone.
"""
import importlib
import pkgutil

from .tensor_names import WEIGHT_SUFFIX, layer_of, tensor_kinds, tensor_name_map, weight_name, weight_pattern
from .registry import Arch, for_hf, get, hf_names, names, register, unregister

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("registry", "tensor_names"):
        importlib.import_module(f"{__name__}.{_module}")  # registers its architecture

__all__ = ["WEIGHT_SUFFIX", "Arch", "for_hf", "get", "hf_names", "layer_of", "names", "register", "unregister",
           "tensor_kinds", "tensor_name_map", "weight_name", "weight_pattern"]
