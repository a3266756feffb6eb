"""Llama 4 text checkpoints (`Llama4ForCausalLM`) -> GGUF `llama4`, in the layout llama.cpp's converter writes.

What differs from the generic converter (`converters.base`):
  * dense and MoE layers interleave (`moe_layers`, every `interleave_moe_layer_step`-th layer from
    layer step - 1, llama.cpp's rule): dense layers' FFN is `intermediate_size_mlp` wide
    (feed_forward_length), experts and the shared expert `intermediate_size`
    (expert_feed_forward_length); the shared expert has no gate;
  * experts are fused and transposed: `feed_forward.experts.gate_up_proj` [E, D, 2F] (gate columns
    first), `down_proj` [E, F, D];
  * Q/K rows stay as they are (the checkpoint rotates adjacent pairs, llama.cpp's NORM RoPE);
  * `attention.sliding_window` holds `attention_chunk_size` (0 when every layer is full
    attention) and `attention.temperature_scale` / `temperature_length` the query temperature's
    `attn_scale` / `floor_scale`. llama.cpp reads none of these values (it fixes 8192, 0.1 and
    8192, those of the released models); Strata honours them, so a checkpoint with others runs as
    transformers runs it in Strata only (a warning says so);
  * what llama.cpp's graph fixes and GGUF cannot say is refused: NoPE layers other than every
    `no_rope_layer_interval`=4th, chunked layers other than the RoPE ones, qk-norm other than "all
    but 128-expert models", temperature tuning off.
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import logging

import gguf
from gguf import MODEL_TENSOR as MT

from converters.base import Converter, HParams
from converters.experts import ExpertSource, TransposedSource
from converters.source import ConversionError, SourceTensor

log = logging.getLogger("strata.convert")

_ATTN = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.FFN_NORM)
_DENSE = (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)
_MOE = (MT.FFN_GATE_INP, MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP)


class Llama4Converter(Converter):

    def read_hparams(self) -> HParams:
        n_embd, n_heads = int(self.get("hidden_size")), int(self.get("num_attention_heads"))
        theta = self.get("rope_theta", default=None) or self.rope_parameters().get("rope_theta", 10000.0)
        n_ff_exp = int(self.get("intermediate_size"))
        hp = HParams(
            n_layers=int(self.get("num_hidden_layers")), n_embd=n_embd, n_heads=n_heads,
            n_kv_heads=int(self.get("num_key_value_heads", default=n_heads)),
            head_dim=int(self.get("head_dim", default=n_embd // n_heads)), n_vocab=int(self.get("vocab_size")),
            n_ctx=int(self.get("max_position_embeddings")), n_ff=int(self.get("intermediate_size_mlp")),
            n_experts=int(self.get("num_local_experts")), n_experts_used=int(self.get("num_experts_per_tok")),
            n_ff_exp=n_ff_exp, rope_theta=float(theta), rms_eps=float(self.get("rms_norm_eps")),
            tied_embeddings=bool(self.get("tie_word_embeddings", default=False)), n_ff_shexp=n_ff_exp)
        self.step = int(self.get("interleave_moe_layer_step", default=1))
        if self.step <= 0:
            raise ConversionError(f"{self.config_path}: interleave_moe_layer_step={self.step}, expected > 0")
        self._refuse(hp)
        return hp

    def _refuse(self, hp: HParams) -> None:
        """What llama.cpp's llama4 graph fixes and GGUF has no key for."""
        n, c, path = hp.n_layers, self.cfg, self.config_path
        moe = [i for i in range(n) if (i + 1) % self.step == 0]
        if list(c.get("moe_layers") or moe) != moe:
            raise ConversionError(f"{path}: moe_layers={c['moe_layers']}: GGUF llama4 has MoE layers at every "
                                  f"interleave_moe_layer_step={self.step}th layer only ({moe})")
        rope = [int((i + 1) % 4 != 0) for i in range(n)]
        if [int(r) for r in (c.get("no_rope_layers") or rope)] != rope:
            raise ConversionError(f"{path}: no_rope_layers={c['no_rope_layers']}: llama.cpp's llama4 graph skips "
                                  f"RoPE on every 4th layer only ({rope})")
        chunk = c.get("attention_chunk_size")
        types = c.get("layer_types") or ["chunked_attention" if r else "full_attention" for r in rope]
        all_full = all(t == "full_attention" for t in types)
        if not all_full and (types != ["chunked_attention" if r else "full_attention" for r in rope] or not chunk):
            raise ConversionError(f"{path}: layer_types={types}, attention_chunk_size={chunk}: GGUF llama4 has "
                                  "chunked attention on exactly the RoPE layers, with a chunk size")
        want_norm = hp.n_experts != 128
        if bool(c.get("use_qk_norm", True)) != want_norm:
            raise ConversionError(f"{path}: use_qk_norm={c.get('use_qk_norm')} with {hp.n_experts} experts: llama.cpp's "
                                  f"llama4 graph uses the qk-norm unless a model has 128 experts")
        if not all_full and c.get("attn_temperature_tuning", True) is False:
            raise ConversionError(f"{path}: attn_temperature_tuning=False: llama.cpp's llama4 graph always "
                                  "tunes the NoPE layers' query temperature")
        self.chunk = 0 if all_full else int(chunk)
        self.floor, self.scale = int(c.get("floor_scale", 8192)), float(c.get("attn_scale", 0.1))
        if self.chunk and (self.chunk, self.floor, self.scale) != (8192, 8192, 0.1):
            log.warning("%s: attention_chunk_size=%d, floor_scale=%d, attn_scale=%g written to the GGUF file (Strata "
                        "honours them) but llama.cpp's llama4 graph fixes 8192, 8192 and 0.1: llama.cpp's outputs will "
                        "differ from transformers' past those positions", path, self.chunk, self.floor, self.scale)

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        super().write_metadata(w)
        w.add_interleave_moe_layer_step(self.step)
        w.add_sliding_window(self.chunk)
        if self.chunk:
            w.add_attn_temperature_scale(self.scale)
            w.add_attn_temperature_length(self.floor)

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        dense = {MT.FFN_GATE: (hp.n_ff, hp.n_embd), MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff)}
        return dense[kind] if kind in dense else super().expected_shape(kind)

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return _ATTN + (_MOE if bid in self.expert_layers() else _DENSE)

    def expert_layers(self) -> list[int]:
        return [i for i in range(self.hp.n_layers) if (i + 1) % self.step == 0]

    def _fused_source(self, bid: int, srcs: dict[str, SourceTensor]) -> ExpertSource:
        hp = self.hp
        want = {"gate_up_proj": (hp.n_experts, hp.n_embd, 2 * hp.n_ff_exp),
                "down_proj": (hp.n_experts, hp.n_ff_exp, hp.n_embd)}
        for key in want:
            if key not in srcs:
                raise ConversionError(f"{self.ckpt.folder}: layer {bid}: missing "
                                      f"model.layers.{bid}.feed_forward.experts.{key}")
            if srcs[key].shape != want[key]:
                raise ConversionError(f"{srcs[key].path}: tensor {srcs[key].name}: shape {srcs[key].shape}, "
                                      f"expected {want[key]} from config.json")
        return TransposedSource(self.ckpt, srcs["gate_up_proj"], srcs["down_proj"], hp.n_ff_exp, hp.n_embd)


CONVERTER = Llama4Converter
