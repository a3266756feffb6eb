"""MiMo-V2-Flash checkpoints (`MiMoV2FlashForCausalLM`) -> GGUF `mimo2`, in the layout llama.cpp's
converter writes.

What differs from the generic converter (`converters.base`):
  * per-layer attention: `hybrid_layer_pattern` (1: sliding window; or transformers' `layer_types`)
    as `attention.sliding_window_pattern`, the kv heads as an array `attention.head_count_kv`
    (`swa_num_key_value_heads` on sliding layers), key and value head widths of their own
    (`head_dim`, `v_head_dim`), `attention.value_scale`, RoPE over `head_dim * partial_rotary_factor`
    features with the sliding layers' base `rope.freq_base_swa` (the released flat keys `rope_theta`,
    `swa_rope_theta`, `partial_rotary_factor`, or transformers' per-layer-type `rope_parameters`);
    sinks (`attention_sink_bias`, transformers' `sinks`) on the layers that have them;
  * dense FFN layers (`mlp_layer_types` "dense", or `moe_layer_freq` 0) and MoE ones: a sigmoid
    router with its selection bias (`exp_probs_b.bias`, F32), no shared expert;
  * multi-token-prediction layers (`model.mtp.layers.N.*`, a dense sliding-window block with
    enorm / hnorm / eh_proj and a final norm) are kept: written as blocks num_hidden_layers + N
    (`nextn.*`, `layer_output_norm`), with `nextn_predict_layers` and their entries in the per-layer
    arrays, as llama.cpp's converter writes them unless told --no-mtp.
The sliding window is config.json's `sliding_window`, as llama.cpp's converter writes it
(transformers adds one to a released `sliding_window_size`: the released config's two keys differ).
Must not: write files (the pipeline does) or quantize (types).
"""
from __future__ import annotations

import re

import gguf
from gguf import MODEL_TENSOR as MT
from gguf.constants import ExpertGatingFuncType, Keys

from converters.base import Converter, HParams, PlannedTensor
from converters.biased_router import BiasedRouterMixin
from converters.source import ConversionError, SourceTensor
from converters.types import TypePolicy
from strata.arch import weight_name
from strata.gguf.hparams import VALUE_SCALE

_MTP = re.compile(r"^model\.mtp\.layers\.(\d+)\.(.+)$")
#: MTP-only tensors, by their name inside the block (gguf-py 0.19's MIMO2 table lacks them).
_MTP_ONLY = {"enorm": MT.NEXTN_ENORM, "hnorm": MT.NEXTN_HNORM, "eh_proj": MT.NEXTN_EH_PROJ,
             "final_layernorm": MT.LAYER_OUT_NORM, "shared_head.norm": MT.NEXTN_SHARED_HEAD_NORM,
             "shared_head.head": MT.NEXTN_SHARED_HEAD_HEAD, "embed_tokens": MT.NEXTN_EMBED_TOKENS}
_ATTN = (MT.ATTN_NORM, MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V, MT.ATTN_OUT, MT.FFN_NORM)
_DENSE = (MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN)


class MiMo2Converter(BiasedRouterMixin, Converter):
    def read_hparams(self) -> HParams:
        c = self.cfg
        n = int(self.get("num_hidden_layers"))
        self.n_mtp = len({int(m[1]) for name in self.ckpt.tensors if (m := _MTP.match(name))})
        self.swa = self._flags("hybrid_layer_pattern", "layer_types", "sliding_attention", n)
        self.moe = self._flags("moe_layer_freq", "mlp_layer_types", "sparse", n)
        n_embd, n_heads = int(self.get("hidden_size")), int(self.get("num_attention_heads"))
        head_dim = int(self.get("head_dim"))
        self.v_dim = int(self.get("v_head_dim", default=head_dim))
        n_kv = int(self.get("num_key_value_heads"))
        self.n_kv_swa = int(self.get("swa_num_key_value_heads", default=2 * n_kv))  # transformers doubles them
        for key, want in (("swa_head_dim", head_dim), ("swa_v_head_dim", self.v_dim), ("swa_num_attention_heads", n_heads)):
            if c.get(key, want) != want:
                raise ConversionError(f"{self.config_path}: {key}={c[key]} differs from the full layers' {want}: "
                                      "GGUF mimo2 has one head size and head count")
        rp = self.all_rope_parameters()
        full, sliding = (rp.get("full_attention"), rp.get("sliding_attention")) if "full_attention" in rp else (rp, {})
        self.theta_swa = float(c.get("swa_rope_theta") or sliding.get("rope_theta") or 10000.0)
        factor = float(c.get("partial_rotary_factor") or full.get("partial_rotary_factor") or 1.0)
        self.rope = int(head_dim * factor)
        if not (0 < self.rope <= head_dim and self.rope % 2 == 0):
            raise ConversionError(f"{self.config_path}: partial_rotary_factor {factor} gives {self.rope} rotary "
                                  f"features of head_dim {head_dim}, expected an even number in 2..{head_dim}")
        if int(c.get("n_group") or 1) > 1:
            raise ConversionError(f"{self.config_path}: n_group={c['n_group']}: llama.cpp's mimo2 graph routes without "
                                  "expert groups")
        theta = c.get("rope_theta") or full.get("rope_theta") or 10000.0
        return HParams(
            n_layers=n, n_embd=n_embd, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
            n_vocab=int(self.get("vocab_size")), n_ctx=int(self.get("max_position_embeddings")),
            n_ff=int(self.get("intermediate_size")), n_experts=int(self.get("n_routed_experts", "num_local_experts")),
            n_experts_used=int(self.get("num_experts_per_tok")), n_ff_exp=int(self.get("moe_intermediate_size")),
            rope_theta=float(theta), rms_eps=float(self.get("layernorm_epsilon", "rms_norm_eps")),
            tied_embeddings=bool(self.get("tie_word_embeddings", default=False)))

    def _flags(self, released: str, hf: str, hf_true: str, n: int) -> list[bool]:
        """Per layer flags from the released 0/1 list or transformers' per-layer names."""
        raw = self.cfg.get(released)
        flags = [bool(v) for v in raw] if raw is not None else None
        if flags is None and self.cfg.get(hf) is not None:
            flags = [t == hf_true for t in self.cfg[hf]]
        if flags is None or len(flags) != n:
            raise ConversionError(f"{self.config_path}: {released} (or {hf}): expected one entry for each of {n} "
                                  f"layers, found {raw if raw is not None else self.cfg.get(hf)!r}")
        return flags

    def write_metadata(self, w: gguf.GGUFWriter) -> None:
        hp, c, name = self.hp, self.cfg, self.arch.name
        swa = self.swa + [True] * self.n_mtp  # MTP blocks are sliding-window shaped
        w.add_context_length(hp.n_ctx)
        w.add_embedding_length(hp.n_embd)
        w.add_block_count(hp.n_layers + self.n_mtp)
        w.add_feed_forward_length(hp.n_ff)
        w.add_head_count(hp.n_heads)
        w.add_head_count_kv([self.n_kv_swa if s else hp.n_kv_heads for s in swa])
        w.add_rope_freq_base(hp.rope_theta)
        w.add_rope_freq_base_swa(self.theta_swa)
        w.add_layer_norm_rms_eps(hp.rms_eps)
        w.add_expert_count(hp.n_experts)
        w.add_expert_used_count(hp.n_experts_used)
        if c.get("n_group") is not None:  # as llama.cpp's converter writes them (one group: no grouping)
            w.add_expert_group_count(int(c["n_group"]))
            w.add_expert_group_used_count(int(self.get("topk_group")))
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)  # llama.cpp's graph fixes it, as it fixes the norm
        w.add_key_length(hp.head_dim)
        w.add_value_length(self.v_dim)
        w.add_sliding_window(int(self.get("sliding_window")))
        w.add_sliding_window_pattern(swa)
        w.add_uint32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=name), hp.n_ff_exp)
        w.add_rope_dimension_count(self.rope)
        scale = c.get("attention_value_scale")
        if scale is not None and float(scale) != 1.0:
            w.add_float32(VALUE_SCALE.format(arch=name), float(scale))
        if self.n_mtp:
            w.add_uint32(Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=name), self.n_mtp)
        if c.get("routed_scaling_factor") not in (None, 1.0):
            w.add_expert_weights_scale(float(c["routed_scaling_factor"]))

    def expected_shape(self, kind: MT) -> tuple[int, ...] | None:
        hp = self.hp
        own = {MT.ATTN_V: None, MT.ATTN_K: None, MT.ATTN_OUT: (hp.n_embd, hp.n_heads * self.v_dim),
               MT.ATTN_SINKS: (hp.n_heads,), MT.FFN_EXP_PROBS_B: (hp.n_experts,),
               MT.FFN_GATE: (hp.n_ff, hp.n_embd), MT.FFN_UP: (hp.n_ff, hp.n_embd), MT.FFN_DOWN: (hp.n_embd, hp.n_ff),
               MT.NEXTN_ENORM: (hp.n_embd,), MT.NEXTN_HNORM: (hp.n_embd,), MT.LAYER_OUT_NORM: (hp.n_embd,),
               MT.NEXTN_EH_PROJ: (hp.n_embd, 2 * hp.n_embd), MT.NEXTN_SHARED_HEAD_NORM: (hp.n_embd,)}
        return own[kind] if kind in own else super().expected_shape(kind)

    def _kv_rows(self, bid: int) -> int:
        return self.n_kv_swa if bid >= self.hp.n_layers or self.swa[bid] else self.hp.n_kv_heads

    def expert_layers(self) -> list[int]:
        return [i for i, moe in enumerate(self.moe) if moe]

    def layer_tensors(self, bid: int) -> tuple[MT, ...]:
        return _ATTN + ((MT.ATTN_SINKS,) if self._has_sinks(bid) else ()) + \
            ((MT.FFN_GATE_INP,) if bid < self.hp.n_layers and self.moe[bid] else _DENSE)

    def _has_sinks(self, bid: int) -> bool:
        key = "add_swa_attention_sink_bias" if bid >= self.hp.n_layers or self.swa[bid] else "add_full_attention_sink_bias"
        default = bid >= self.hp.n_layers or self.swa[bid]  # transformers: sinks on sliding layers only
        return bool(self.cfg.get(key, default))

    def _split_sources(self):
        """MTP layers as the blocks after the trunk (model.mtp.layers.N -> model.layers.n_layers+N)."""
        every = self.ckpt.tensors
        self.ckpt.tensors = {self._trunk_name(name): src for name, src in every.items()}
        self.name_map = gguf.get_tensor_name_map(self.arch.tensors, self.hp.n_layers + self.n_mtp)
        try:
            return Converter._split_sources(self)  # the mixin's would drop the MTP blocks
        finally:
            self.ckpt.tensors = every

    def _trunk_name(self, name: str) -> str:
        m = _MTP.match(name)
        return name if m is None else f"model.layers.{self.hp.n_layers + int(m[1])}.{m[2]}"

    def _map_resident(self, name: str, src: SourceTensor):
        if name.endswith(("attention_sink_bias", ".sinks")):  # no suffix in the checkpoint
            name += ".weight"
        bid = _layer(name, self.hp.n_layers)
        if bid is None or bid < self.hp.n_layers:
            return super()._map_resident(name, src)
        rest = name.split(".", 3)[3].removesuffix(".weight")  # an MTP block's own name for it
        found = (_MTP_ONLY[rest], weight_name(_MTP_ONLY[rest], bid)) if rest in _MTP_ONLY else \
            self.name_map.get_type_and_name(name, try_suffixes=(".weight", ".bias"))
        if found is None or found[0] in (MT.FFN_GATE_INP, MT.FFN_EXP_PROBS_B) or bid >= self.hp.n_layers + self.n_mtp:
            raise ConversionError(f"{src.path}: unexpected tensor {src.name} in MTP layer {bid - self.hp.n_layers} "
                                  "(a dense sliding-window block with enorm, hnorm, eh_proj)")
        return found[0], found[1], bid

    def _check_shape(self, kind: MT, src: SourceTensor, found: tuple[int, ...]) -> None:
        hp, bid = self.hp, _layer(src.name, self.hp.n_layers)
        if kind in (MT.ATTN_K, MT.ATTN_V) and bid is not None:
            width = hp.head_dim if kind == MT.ATTN_K else self.v_dim
            want = (self._kv_rows(bid) * width, hp.n_embd)
            if tuple(found) != want:
                raise ConversionError(f"{src.path}: tensor {src.name}: weight shape {tuple(found)}, expected {want} "
                                      "from config.json")
            return
        super()._check_shape(kind, src, found)

    def plan_resident(self, kind: MT, gname: str, bid: int | None, src: SourceTensor,
                      policy: TypePolicy) -> list[PlannedTensor]:
        if kind == MT.FFN_EXP_PROBS_B:  # F32, as llama.cpp keeps it
            self._check_shape(kind, src, src.shape)
            return [PlannedTensor(gname, kind, bid, src.shape, gguf.GGMLQuantizationType.F32,
                                  [lambda: self.ckpt.read_rows(src.name).reshape(1, -1)], src.nbytes, (src.name,))]
        return super().plan_resident(kind, gname, bid, src, policy)

    def _check_complete(self, names: set[str]) -> None:
        super()._check_complete(names)
        for bid in range(self.hp.n_layers, self.hp.n_layers + self.n_mtp):
            want = [weight_name(k, bid) for k in _ATTN + _DENSE + (MT.NEXTN_EH_PROJ, MT.NEXTN_ENORM, MT.NEXTN_HNORM)]
            missing = [n for n in want if n not in names]
            if missing:
                raise ConversionError(f"{self.ckpt.folder}: MTP layer {bid - self.hp.n_layers} lacks "
                                      f"{', '.join(missing[:4])}")


def _layer(name: str, n_layers: int) -> int | None:
    """The block of an HF tensor name (model.layers.N.… or model.mtp.layers.N.…, after the trunk)."""
    m = _MTP.match(name)
    if m is not None:
        return n_layers + int(m[1])
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() else None


CONVERTER = MiMo2Converter
