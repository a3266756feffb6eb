"""Moved to `strata.quant_torch` (torch dequantization sits with the other quant code); this name
stays only until `strata.models.loader` imports it from there. Must not hold code."""
from strata.quant_torch import TORCH_DEQUANT_TYPES, dequantize_into

__all__ = ["TORCH_DEQUANT_TYPES", "dequantize_into"]
