"""gpt-oss checkpoints (`GptOssForCausalLM`) -> GGUF `gpt-oss`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * experts are fused and transposed: `experts.gate_up_proj` [E, D, 2I] with gate and up
    columns interleaved (gate = [..., ::2]), `experts.down_proj` [E, I, D]; their biases
    `gate_up_proj_bias` [E, 2I] (interleaved too) and `down_proj_bias` [E, D] become float32
    `ffn_{gate,up,down}_exps.bias` [E, I] / [E, D];
  * attention sinks (`self_attn.sinks` [H] -> `attn_sinks.weight`), biases on q, k, v and the
    output projection, the FFN's pre-norm stored as `post_attention_norm`;
  * `attention.sliding_window` (llama.cpp uses it on every other layer, from layer 0, unless
    `attention.sliding_window_pattern` lists the layers: written when `layer_types` differ) and
    the expert FFN length;
  * the clamped SwiGLU's alpha and limit have no GGUF key: llama.cpp fixes them at 1.702 and 7.0,
    so other values are refused.
Sources are bf16/f16/f32 (`--experts` chooses the experts' type as for any architecture), or the
released MXFP4 form (`quantization_config.quant_method` "mxfp4"): experts as `*_blocks` [E, rows,
cols/32, 16] uint8 (two e2m1 codes a byte, value 2j in the low nibble) and `*_scales` [E, rows,
cols/32] E8M0, in [out, in] orientation. Those stay MXFP4 whatever `--experts` says: their nibbles
are repacked into ggml's blocks (scale byte, then 16 bytes holding values j and j+16), no values
change.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import logging

import gguf
import numpy as np
from gguf import MODEL_TENSOR as MT
from gguf.constants import Keys

from converters.base import Converter, HParams, PlannedTensor
from converters.experts import TransposedSource
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy
from strata.arch import weight_name

log = logging.getLogger("strata.convert")

_PARTS = {"gate": MT.FFN_GATE_EXP, "up": MT.FFN_UP_EXP, "down": MT.FFN_DOWN_EXP}


def ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF MXFP4 blocks [rows, n, 16] + scales [rows, n] -> ggml MXFP4 rows [rows, n * 17] (uint8)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)  # value order
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).reshape(blocks.shape[0], -1)


class MXFP4Source:
    """Released gpt-oss experts: gate_up blocks [E, 2I, D/32, 16] (gate and up rows interleaved),
    down blocks [E, D, I/32, 16], with their scales; read as ggml MXFP4 rows, one expert at a time."""

    def __init__(self, ckpt, srcs: dict[str, SourceTensor]):
        self.ckpt, self.srcs = ckpt, srcs

    def read(self, part: str, e: int) -> np.ndarray:
        key = "down_proj" if part == "down" else "gate_up_proj"
        blocks, scales = self.srcs[key + "_blocks"], self.srcs[key + "_scales"]
        rows, n = blocks.shape[1], blocks.shape[2]
        b = np.frombuffer(self.ckpt.read_bytes(blocks, e * rows * n * 16, rows * n * 16), np.uint8).reshape(rows, n, 16)
        sc = np.frombuffer(self.ckpt.read_bytes(scales, e * rows * n, rows * n), np.uint8).reshape(rows, n)
        if part != "down":
            pick = 0 if part == "gate" else 1
            b, sc = b[pick::2], sc[pick::2]
        return ggml_mxfp4(b, sc)

    def nbytes(self, part: str) -> int:
        key = "down_proj" if part == "down" else "gate_up_proj"
        n = self.srcs[key + "_blocks"].nbytes + self.srcs[key + "_scales"].nbytes
        return n if part == "down" else n // 2

    def names(self, part: str) -> tuple[str, ...]:
        key = "down_proj" if part == "down" else "gate_up_proj"
        return (self.srcs[key + "_blocks"].name, self.srcs[key + "_scales"].name)


class GptOssConverter(Converter):
    def read_hparams(self) -> HParams:
        c = self.cfg
        qc = c.get("quantization_config")
        self.mxfp4 = qc is not None and qc.get("quant_method") == "mxfp4"
        if qc is not None and not self.mxfp4:
            raise ConversionError(f"{self.config_path}: quantization_config {qc!r} is not supported (the released "
                                  "MXFP4 form is; otherwise convert a bf16 checkpoint)")
        if (c.get("swiglu_alpha", 1.702), c.get("swiglu_limit", 7.0)) != (1.702, 7.0):
            raise ConversionError(f"{self.config_path}: swiglu_alpha={c.get('swiglu_alpha')}, swiglu_limit="
                                  f"{c.get('swiglu_limit')}: GGUF gpt-oss fixes them at 1.702 and 7.0")
        n = int(self.get("num_hidden_layers"))
        types = c.get("layer_types")
        if types is not None and (len(types) != n or set(types) - {"sliding_attention", "full_attention"}):
            raise ConversionError(f"{self.config_path}: layer_types {types}: expected {n} of sliding_attention / "
                                  "full_attention")
        self.swa_pattern = None if types is None else [t == "sliding_attention" for t in types]
        if self.swa_pattern == [i % 2 == 0 for i in range(n)]:
            self.swa_pattern = None  # llama.cpp's default for gpt-oss: sliding on even layers
        if self.rope_parameters().get("truncate") is False:
            log.warning("%s: YaRN with truncate=false: GGUF has no key for it and llama.cpp (and Strata) round "
                        "the correction dimensions; logits will differ slightly from transformers'", self.config_path)
        hp = super().read_hparams()
        hp.n_ff_exp = int(self.get("intermediate_size"))
        return hp

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_sliding_window(int(self.get("sliding_window")))
        if self.swa_pattern is not None:  # per layer, as llama.cpp's load_swa_pattern reads it
            w.add_sliding_window_pattern(self.swa_pattern)
        w.add_uint32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=self.arch.name), self.hp.n_ff_exp)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        extra = {MT.ATTN_SINKS: (hp.n_heads,), MT.ATTN_POST_NORM: (hp.n_embd,)}
        return extra[kind] if kind in extra else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.ATTN_SINKS, MT.ATTN_POST_NORM,
                MT.FFN_GATE_INP)

    def _split_sources(self):
        """The generic split, with the experts' fused tensors and biases taken out first."""
        self._fused: dict[int, dict[str, SourceTensor]] = {}
        keep = {}
        for name, src in self.ckpt.tensors.items():
            parts = name.split(".")
            if len(parts) == 6 and parts[3:5] == ["mlp", "experts"] and parts[2].isdigit():
                self._fused.setdefault(int(parts[2]), {})[parts[5]] = src
            else:
                keep[name] = src
        all_tensors, self.ckpt.tensors = self.ckpt.tensors, keep
        try:
            resident, experts = super()._split_sources()
        finally:
            self.ckpt.tensors = all_tensors
        return resident, {bid: {"gpt_oss": found} for bid, found in self._fused.items()}

    def _map_resident(self, name: str, src: SourceTensor):
        if name.endswith(".sinks"):  # gguf-py's table names it with a suffix, as llama.cpp's converter adds
            return super()._map_resident(name + ".weight", src)
        return super()._map_resident(name, src)

    def _plan_experts(self, bid: int, found, policy: TypePolicy) -> list[PlannedTensor]:
        srcs = (found or {}).get("gpt_oss", {})
        hp = self.hp
        E, D, I = hp.n_experts, hp.n_embd, hp.n_ff_exp
        if self.mxfp4:
            if D % 32 or I % 32:
                raise ConversionError(f"{self.config_path}: MXFP4 experts need hidden_size ({D}) and "
                                      f"intermediate_size ({I}) in whole blocks of 32")
            want = {"gate_up_proj_blocks": (E, 2 * I, D // 32, 16), "gate_up_proj_scales": (E, 2 * I, D // 32),
                    "down_proj_blocks": (E, D, I // 32, 16), "down_proj_scales": (E, D, I // 32)}
        else:
            want = {"gate_up_proj": (E, D, 2 * I), "down_proj": (E, I, D)}
        want.update(gate_up_proj_bias=(E, 2 * I), down_proj_bias=(E, D))
        for key, shape in want.items():
            src = srcs.get(key)
            if src is None:
                raise ConversionError(f"{self.ckpt.folder}: layer {bid}: missing model.layers.{bid}.mlp.experts.{key}")
            if src.shape != shape or (src.dtype == "U8") != key.endswith(("_blocks", "_scales")):
                raise ConversionError(f"{src.path}: tensor {src.name}: shape {src.shape} {src.dtype}, expected "
                                      f"{shape} from config.json")
        for key in srcs:
            if key not in want:
                raise ConversionError(f"{srcs[key].path}: unexpected tensor {srcs[key].name}")
        source = MXFP4Source(self.ckpt, srcs) if self.mxfp4 else \
            TransposedSource(self.ckpt, srcs["gate_up_proj"], srcs["down_proj"], I, D, interleaved=True)
        planned = []
        for part, kind in _PARTS.items():
            rows, cols = self.expected_shape(kind)
            name, shape = weight_name(kind, bid), (hp.n_experts, rows, cols)
            pieces = [lambda part=part, e=e: source.read(part, e) for e in range(hp.n_experts)]
            ggml_type = gguf.GGMLQuantizationType.MXFP4 if self.mxfp4 else policy.choose(kind, shape, name)
            planned.append(PlannedTensor(name, kind, bid, shape, ggml_type, pieces,
                                         source.nbytes(part), source.names(part)))
        return planned + self._plan_expert_biases(bid, srcs)

    def _plan_expert_biases(self, bid: int, srcs: dict[str, SourceTensor]) -> list[PlannedTensor]:
        hp, f32 = self.hp, gguf.GGMLQuantizationType.F32
        gate_up, down = srcs["gate_up_proj_bias"], srcs["down_proj_bias"]
        out = []
        for part, src, pick in (("gate", gate_up, 0), ("up", gate_up, 1), ("down", down, None)):
            kind = _PARTS[part]
            width = hp.n_embd if part == "down" else hp.n_ff_exp

            def piece(src=src, pick=pick) -> np.ndarray:
                values = self.ckpt.read_rows(src.name)  # [E, 2I] or [E, D]
                return np.ascontiguousarray(values if pick is None else values[:, pick::2])

            out.append(PlannedTensor(weight_name(kind, bid, "bias"), kind, bid, (hp.n_experts, width), f32, [piece],
                                     src.nbytes // (1 if pick is None else 2), (src.name,)))
        return out


CONVERTER = GptOssConverter
