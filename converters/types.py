"""Which ggml type each output tensor gets, and turning float32 values into those bytes.

Must not open files or decide by tensor name: the policy looks at a tensor's kind and shape only.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import gguf
import gguf.quants
import numpy as np
from gguf import MODEL_TENSOR as MT

from strata import native
from strata.defaults import CONVERT_OUTTYPES, CONVERT_TYPES, DEFAULT_ATTN_TYPE, DEFAULT_EXPERTS_TYPE
from strata.quant import GGMLType, block_size, ggml_type

log = logging.getLogger("strata.convert")

#: Types a user may ask for, by command-line name.
CHOICES, OUTTYPES = CONVERT_TYPES, CONVERT_OUTTYPES  # defined where `strata convert --help` reads them

#: Kept in float32 whatever was asked: routers, the shared-expert gate and the sparse-attention
#: indexer's head weights (tiny, and they pick experts or positions, so rounding them changes the
#: choice; llama.cpp's converter keeps them so too).
_FLOAT_KINDS = frozenset({MT.FFN_GATE_INP, MT.FFN_GATE_INP_SHEXP, MT.INDEXER_PROJ})
_EXPERT_KINDS = frozenset({MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP})
_SHARED_KINDS = frozenset({MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP})

#: What a type falls back to when a tensor's rows are not a whole number of its blocks.
_FALLBACK = {GGMLType.Q4_K: GGMLType.Q8_0, GGMLType.Q6_K: GGMLType.Q8_0, GGMLType.Q8_0: GGMLType.F16,
             GGMLType.MXFP4: GGMLType.Q8_0}

#: general.file_type for a file whose experts (its bulk) are of a type, as llama.cpp labels it.
_FILE_TYPE = {
    GGMLType.F32: gguf.LlamaFileType.ALL_F32, GGMLType.F16: gguf.LlamaFileType.MOSTLY_F16,
    GGMLType.BF16: gguf.LlamaFileType.MOSTLY_BF16, GGMLType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    GGMLType.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M, GGMLType.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
    GGMLType.MXFP4: gguf.LlamaFileType.MOSTLY_MXFP4_MOE,
}


@dataclass(frozen=True)
class TypePolicy:
    """--attn / --experts / --shared-experts, resolved to ggml types."""
    attn: GGMLType = ggml_type(DEFAULT_ATTN_TYPE)
    experts: GGMLType = ggml_type(DEFAULT_EXPERTS_TYPE)
    shared: GGMLType = ggml_type(DEFAULT_ATTN_TYPE)

    @classmethod
    def from_args(cls, attn: str = DEFAULT_ATTN_TYPE, experts: str = DEFAULT_EXPERTS_TYPE, shared: str | None = None,
                  outtype: str | None = None) -> "TypePolicy":
        if outtype is not None:
            attn = experts = shared = outtype
        return cls(ggml_type(attn), ggml_type(experts), ggml_type(shared or attn))

    @property
    def file_type(self) -> gguf.LlamaFileType:
        return _FILE_TYPE[self.experts]

    def choose(self, kind: MT, shape: tuple[int, ...], name: str) -> GGMLType:
        """Type of a tensor of `kind` with row-major `shape` (last dimension = row length)."""
        if len(shape) < 2 or kind in _FLOAT_KINDS:
            return GGMLType.F32
        t = self.experts if kind in _EXPERT_KINDS else self.shared if kind in _SHARED_KINDS else self.attn
        want = t
        while shape[-1] % block_size(t)[0]:
            t = _FALLBACK.get(t, GGMLType.F16)
        if t != want:
            log.warning("%s: rows of %d values are not whole %s blocks; writing %s", name, shape[-1], want.name, t.name)
        return t


def encode(values: np.ndarray, t: GGMLType, n_threads: int) -> np.ndarray:
    """float32 [rows, cols] -> the bytes of type `t` (uint8 or float array, C order)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if t == GGMLType.F32:
        return values
    if t == GGMLType.F16:
        return values.astype(np.float16)
    if t in (GGMLType.BF16, GGMLType.MXFP4):  # no native quantizer for these: gguf-py's (numpy)
        return gguf.quants.quantize(values.reshape(-1, values.shape[-1]), t)
    return native.quantize(t, values.reshape(-1, values.shape[-1]), n_threads=n_threads)
