"""Qwen3.5-MoE checkpoints (`Qwen3_5MoeForCausalLM`, text only) -> GGUF `qwen35moe`, in the layout
llama.cpp's converter writes.

Qwen3-Next's converter (`converters.qwen3next`: ssm.* keys, recurrent layers, ssm_a = -exp(A_log),
offset norms, skipped MTP weights) with what differs:
  * the DeltaNet projections come apart: in_proj_qkv [all q | all k | all v] -> `attn_qkv`,
    in_proj_z -> `attn_gate`, in_proj_b -> `ssm_beta`, in_proj_a -> `ssm_alpha`;
  * with fewer key than value heads, the value heads go from grouped by key head [k0: v0..v(r-1),
    k1: ...] to tiled over them [v0 of k0, v0 of k1, ..., v1 of k0, ...] in every tensor indexed
    by value head (the v rows of attn_qkv and the v channels of ssm_conv1d, attn_gate, ssm_beta,
    ssm_alpha, ssm_a, ssm_dt, the columns of ssm_out), so that llama.cpp broadcasts key heads
    by tiling; `strata.models` reads the file the same way (`Arch.deltanet_tiled`);
  * `rope.dimension_sections` is written (rope_parameters' mrope_section padded to 4, else [11, 11,
    10, 0]: llama.cpp requires the key); no feed_forward_length (the config has no dense FFN).
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT

from converters.base import PlannedTensor
from converters.qwen3next import _COMMON, _FULL, Qwen3NextConverter
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy

_DEFAULT_SECTIONS = [11, 11, 10, 0]  # transformers' Qwen3_5TextRotaryEmbedding default, as llama.cpp writes it
_LINEAR = (MT.ATTN_QKV, MT.ATTN_GATE, MT.SSM_CONV1D, MT.SSM_A, MT.SSM_BETA, MT.SSM_ALPHA, MT.SSM_NORM, MT.SSM_OUT)
#: Kinds indexed by value head along their rows (attn_qkv and ssm_conv1d after their q and k rows).
_BY_VALUE_HEAD = (MT.ATTN_QKV, MT.ATTN_GATE, MT.SSM_BETA, MT.SSM_ALPHA, MT.SSM_A, MT.SSM_DT, MT.SSM_CONV1D)


class Qwen35MoeConverter(Qwen3NextConverter):
    dense_ffn_key = False  # no dense FFN: llama.cpp reads no feed_forward_length

    def read_hparams(self):
        self.cfg.setdefault("intermediate_size", 0)  # no dense FFN: nothing reads feed_forward_length
        hp = super().read_hparams()
        sections = self.rope_parameters().get("mrope_section", _DEFAULT_SECTIONS)
        if not isinstance(sections, list) or len(sections) > 4 or not all(isinstance(s, int) and s >= 0 for s in sections):
            raise ConversionError(f"{self.config_path}: rope_parameters.mrope_section={sections!r}: expected up to 4 "
                                  "non-negative integers")
        self.sections = list(sections) + [0] * (4 - len(sections))
        return hp

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_rope_dimension_sections(self.sections)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        D, key, value = self.hp.n_embd, self.hk * self.dk, self.hv * self.dv
        own = {MT.ATTN_QKV: (2 * key + value, D), MT.ATTN_GATE: (value, D), MT.SSM_BETA: (self.hv, D),
               MT.SSM_ALPHA: (self.hv, D)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return _COMMON + (_LINEAR if self.recurrent[bid] else _FULL)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        if kind == MT.SSM_CONV1D:
            (planned,) = super().plan_resident(kind, gname, bid, src, policy)
            read = planned.pieces[0]
            planned.pieces = [lambda: self.tile(kind, read())]
            return [planned]
        return super().plan_resident(kind, gname, bid, src, policy)

    def transform(self, kind: MT, values: np.ndarray) -> np.ndarray:
        values = super().transform(kind, values)
        if kind == MT.SSM_OUT:  # columns: transpose, tile the rows, transpose back
            return np.ascontiguousarray(self.tile(MT.ATTN_GATE, values.T).T)
        return self.tile(kind, values) if kind in _BY_VALUE_HEAD else values

    def transformed_kinds(self) -> frozenset[MT]:
        return super().transformed_kinds() | frozenset(_BY_VALUE_HEAD) | {MT.SSM_OUT}

    def tile(self, kind: MT, rows: np.ndarray) -> np.ndarray:
        """Value heads from grouped by key head to tiled over key heads, along the rows of a `kind`
        tensor (attn_qkv and ssm_conv1d: the v rows after q and k only)."""
        r = self.hv // self.hk
        if r == 1:
            return rows
        skip = 2 * self.hk * self.dk if kind in (MT.ATTN_QKV, MT.SSM_CONV1D) else 0
        head, rest = rows[skip:], rows.shape[1:]
        per = head.shape[0] // self.hv  # rows of one value head: dv, or 1 (beta, alpha, a, dt)
        tiled = head.reshape(self.hk, r, per, *rest).swapaxes(0, 1).reshape(head.shape)
        return np.concatenate([rows[:skip], tiled]) if skip else tiled


CONVERTER = Qwen35MoeConverter
