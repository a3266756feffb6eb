"""What the native runtime does with each ggml type, read from the table of quant types
(strata/quant_table.py, which its C tables are generated from) and the kernel choice on this CPU:
whether it dequantizes the type, whether it multiplies straight from its packed blocks, and with
which kernel family. For load-time checks (one error naming the tensor) and `inspect`'s verdict line.

    s = native.type_support("IQ2_XXS")
    s.dequant, s.packed, s.families, s.runs   # True, True, ('scalar',), 'scalar'
    s.verdict()                               # 'IQ2_XXS: dequantize yes; packed compute yes (scalar kernels)'
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from strata.quant import GGMLType, ggml_type
from strata.quant_table import BY_NAME

from ._lib import default_impl, impl_code, lib
from .qdot import has_qdot_kernel, kernel_family

#: Kernel families, narrowest first (a family without its own kernel runs the next one down).
FAMILIES = ("scalar", "avx2", "avx512")


@dataclass(frozen=True)
class TypeSupport:
    """The native runtime's support of one ggml type.

    dequant: it dequantizes the type (float path, embedding rows, norms);
    packed: it multiplies from the packed blocks (packed compute: experts and weight matrices);
    families: the kernel families with a packed kernel of their own, narrowest first;
    runs: the family whose packed kernel runs prefill on this machine by default (None: no packed
    kernel; an AVX-512 machine runs some types' AVX2 tiles, where the kernel table measured them faster);
    decode_runs: the same for decode (calls of fewer than 4 tokens)."""
    type: GGMLType
    dequant: bool
    packed: bool
    families: tuple[str, ...]
    runs: str | None
    decode_runs: str | None = None

    def verdict(self) -> str:
        """One line: 'IQ2_XXS: dequantize yes; packed compute yes (scalar kernels)'."""
        if not self.dequant and not self.packed:
            return f"{self.type.name}: not supported (no dequantization, no packed kernels)"
        packed = f"yes ({'/'.join(self.families)} kernels)" if self.packed else "no"
        return f"{self.type.name}: dequantize {'yes' if self.dequant else 'no'}; packed compute {packed}"


@lru_cache(maxsize=None)
def type_support(t: int | str | GGMLType) -> TypeSupport:
    """The native runtime's support of ggml type `t` (enum, id or name)."""
    t = ggml_type(t)
    own = tuple(f for f in FAMILIES if has_qdot_kernel(t, f))
    runs, decode_runs = ((kernel_family(t, default_impl(), d) if t.name in BY_NAME else None) for d in (False, True))
    return TypeSupport(t, bool(lib.strata_dequant_has_kernel(int(t), impl_code("scalar"))), bool(own), own, runs,
                       decode_runs)


def supported_types(packed: bool = False) -> tuple[GGMLType, ...]:
    """Every ggml type the runtime dequantizes (packed=True: multiplies from packed blocks too)."""
    return tuple(t for t in GGMLType if type_support(t).dequant and (type_support(t).packed or not packed))


__all__ = ["FAMILIES", "TypeSupport", "supported_types", "type_support"]
