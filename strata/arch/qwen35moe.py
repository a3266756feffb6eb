"""Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`, and the text model of the released multimodal
`Qwen3_5MoeForConditionalGeneration`) as GGUF `qwen35moe`, the form llama.cpp's converter writes.

Qwen3-Next's hybrid design (`strata.arch.qwen3next`: gated DeltaNet layers, every fourth one gated
full attention, MoE with a gated shared expert everywhere) with three differences in the file:
  * the DeltaNet's projections are apart (`attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`), not
    interleaved per key head;
  * llama.cpp's converter reorders the value heads from grouped by key head to tiled over them
    (value head j reads key head j % Hk; `Arch.deltanet_tiled`);
  * RoPE is interleaved multimodal (IMROPE) with a required `rope.dimension_sections`; for text all
    of a token's position streams are equal, so it rotates as NEOX over `rope.dimension_count`.
Converter: `converters.qwen35moe`. Vision towers and multi-token-prediction blocks are not run.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, register

QWEN35MOE = register(Arch(
    name="qwen35moe", tensors=MODEL_ARCH.QWEN35MOE, hf_architectures=("Qwen3_5MoeForCausalLM",),
    hf_multimodal=("Qwen3_5MoeForConditionalGeneration",),
    qk_norm="head", expert_weights_norm=True, shared_expert=True, shared_expert_gate=True, post_attention_norm=True,
    gated_deltanet=True, deltanet_tiled=True, rope_sections=True, converter="qwen35moe",
    metadata=(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH),
))
