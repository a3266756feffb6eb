"""Qwen3-Next checkpoints (`Qwen3NextForCausalLM`) -> GGUF `qwen3next`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * layers are gated DeltaNet (`layer_types` "linear_attention") or full attention; the file says
    which in `attention.recurrent_layers` and `full_attention_interval`, and the DeltaNet sizes in
    `ssm.conv_kernel`, `ssm.state_size` (key head dim), `ssm.group_count` (key heads),
    `ssm.time_step_rank` (value heads) and `ssm.inner_size` (value heads x value head dim);
  * `in_proj_qkvz` [per key head: q, k, v-group, z-group] is split into `attn_qkv` [all q | all k
    | all v] and `attn_gate` [all z], the order the convolution and the gated norm read;
  * `A_log` becomes `ssm_a` = -exp(A_log), `dt_bias` `ssm_dt.bias`, `conv1d` [C, 1, K] `ssm_conv1d`
    [C, K]; `in_proj_ba` (`ssm_ba`), `norm` (`ssm_norm`) and `out_proj` (`ssm_out`) keep their values;
  * the zero-centred RMSNorms (weight 1 + w: layer, q/k and output norms, not the gated one) are
    written as w + 1;
  * full attention's q_proj holds each head's query and output gate ([H * 2 hd, D]), stored as is;
    RoPE over head_dim x partial_rotary_factor features (NEOX, no Q/K permutation);
  * multi-token-prediction weights (`mtp.*`) are skipped.
Llama.cpp's graph assumes the value head dim equals the key head dim (it reads only state_size):
other checkpoints are refused. Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT

from converters.base import Converter, HParams, PlannedTensor
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy
from strata.arch import weight_name
from strata.gguf.hparams import RECURRENT_LAYERS

_COMMON = (MT.ATTN_NORM, MT.ATTN_POST_NORM, MT.FFN_GATE_INP, MT.FFN_GATE_INP_SHEXP,
           MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP)
_FULL = (MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.ATTN_Q_NORM, MT.ATTN_K_NORM)
_LINEAR = (MT.ATTN_QKV, MT.ATTN_GATE, MT.SSM_CONV1D, MT.SSM_A, MT.SSM_BETA_ALPHA, MT.SSM_NORM, MT.SSM_OUT)
#: RMSNorms whose checkpoint weight is w in (1 + w).
_OFFSET_NORMS = frozenset({MT.ATTN_NORM, MT.ATTN_POST_NORM, MT.OUTPUT_NORM, MT.ATTN_Q_NORM, MT.ATTN_K_NORM})


class Qwen3NextConverter(Converter):

    def read_hparams(self) -> HParams:
        hp = super().read_hparams()
        c = self.cfg
        self.dk, self.dv = int(self.get("linear_key_head_dim")), int(self.get("linear_value_head_dim"))
        self.hk, self.hv = int(self.get("linear_num_key_heads")), int(self.get("linear_num_value_heads"))
        self.conv_k = int(self.get("linear_conv_kernel_dim"))
        if self.dk != self.dv or self.hv % self.hk:
            raise ConversionError(f"{self.config_path}: linear_key_head_dim={self.dk}, linear_value_head_dim={self.dv}, "
                                  f"{self.hk} key / {self.hv} value heads: GGUF qwen3next needs equal head dims and "
                                  "value heads a multiple of key heads")
        self.interval = int(self.get("full_attention_interval", default=4))
        types = c.get("layer_types") or ["full_attention" if (i + 1) % self.interval == 0 else "linear_attention"
                                         for i in range(hp.n_layers)]
        if len(types) != hp.n_layers or set(types) - {"full_attention", "linear_attention"}:
            raise ConversionError(f"{self.config_path}: layer_types={types}: expected {hp.n_layers} of "
                                  "'full_attention' / 'linear_attention'")
        self.recurrent = [t == "linear_attention" for t in types]
        factor = float(self.rope_parameters().get("partial_rotary_factor", self.get("partial_rotary_factor", default=0.25)))
        self.rope = int(hp.head_dim * factor)
        if c.get("attention_bias"):
            raise ConversionError(f"{self.config_path}: attention_bias=True is not supported by GGUF qwen3next")
        return hp

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_rope_dimension_count(self.rope)
        w.add_ssm_conv_kernel(self.conv_k)
        w.add_ssm_state_size(self.dk)
        w.add_ssm_group_count(self.hk)
        w.add_ssm_time_step_rank(self.hv)
        w.add_ssm_inner_size(self.dv * self.hv)
        w.add_array(RECURRENT_LAYERS.format(arch=self.arch.name), self.recurrent)
        w.add_full_attention_interval(self.interval)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp, D = self.hp, self.hp.n_embd
        key, value = self.hk * self.dk, self.hv * self.dv
        own = {MT.ATTN_Q: (2 * hp.n_heads * hp.head_dim, D), MT.ATTN_POST_NORM: (D,),
               MT.SSM_CONV1D: (2 * key + value, 1, self.conv_k), MT.SSM_A: (self.hv,), MT.SSM_DT: (self.hv,),
               MT.SSM_BETA_ALPHA: (2 * self.hv, D), MT.SSM_NORM: (self.dv,), MT.SSM_OUT: (D, value),
               MT.SSM_IN: (2 * key + 2 * value, D)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return _COMMON + (_LINEAR if self.recurrent[bid] else _FULL)

    def _map_resident(self, name: str, src: SourceTensor) -> tuple[MT, str, int | None]:
        if name.startswith(("mtp.", "model.mtp.")):
            return MT.NEXTN_EH_PROJ, f"skipped.{name}", None  # dropped in plan_resident
        if name.endswith(".dt_bias"):
            bid = int(name.split(".")[2])
            return MT.SSM_DT, weight_name(MT.SSM_DT, bid, "bias"), bid
        return super()._map_resident(name, src)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        if gname.startswith("skipped."):
            return []
        if kind == MT.SSM_IN:
            return self._split_qkvz(bid, src, policy)
        if kind == MT.SSM_CONV1D:
            self._check_shape(kind, src, src.shape)
            C, K = src.shape[0], src.shape[-1]
            read = lambda: self.ckpt.read_rows(src.name).reshape(C, K)  # noqa: E731
            return [PlannedTensor(gname, kind, bid, (C, K), gguf.GGMLQuantizationType.F32, [read], src.nbytes,
                                  (src.name,))]
        if kind == MT.SSM_A:  # llama.cpp names it without a suffix
            gname = weight_name(MT.SSM_A, bid).removesuffix(".weight")
        return super().plan_resident(kind, gname, bid, src, policy)

    def _split_qkvz(self, bid: int, src: SourceTensor, policy: TypePolicy) -> list[PlannedTensor]:
        """in_proj_qkvz [Hk x (q dk, k dk, v r*dv, z r*dv), D] -> attn_qkv [all q, all k, all v] and attn_gate."""
        self._check_shape(MT.SSM_IN, src, src.shape)
        r, D = self.hv // self.hk, self.hp.n_embd
        sizes = [self.dk, self.dk, r * self.dv, r * self.dv]

        def parts() -> list[np.ndarray]:
            w = self.ckpt.read_rows(src.name).reshape(self.hk, sum(sizes), D)
            return [p.reshape(-1, D) for p in np.split(w, np.cumsum(sizes)[:-1], axis=1)]

        out = []
        for kind, pick in ((MT.ATTN_QKV, lambda p: np.concatenate(p[:3])), (MT.ATTN_GATE, lambda p: p[3])):
            rows = 2 * self.hk * self.dk + self.hv * self.dv if kind == MT.ATTN_QKV else self.hv * self.dv
            name = weight_name(kind, bid)
            out.append(PlannedTensor(name, kind, bid, (rows, D), policy.choose(kind, (rows, D), name),
                                     [lambda pick=pick: pick(parts())], src.nbytes * rows // src.shape[0], (src.name,)))
        return out

    def _check_complete(self, names: set[str]) -> None:
        super()._check_complete(names | {f"{n}.weight" for n in names if n.endswith(".ssm_a")})

    def transform(self, kind: MT, values: np.ndarray) -> np.ndarray:
        if kind in _OFFSET_NORMS:
            return values + 1.0
        if kind == MT.SSM_A:
            return -np.exp(values)
        return values

    def transformed_kinds(self) -> frozenset[MT]:
        return _OFFSET_NORMS | {MT.SSM_A}


CONVERTER = Qwen3NextConverter
