"""Laguna (poolside's Laguna-XS.2 / S.2 / M.1, `LagunaForCausalLM`) as GGUF `laguna`, the form
llama.cpp's converter writes.

Pre-norm blocks of grouped-query attention and a MoE FFN, with these departures from the plain form:
  * a per-layer query head count (`attention.head_count` as an array: XS.2 has 48 on full-attention
    layers, 64 on sliding ones); one key/value head count for every layer;
  * RMSNorm of each query and key head before RoPE (NEOX);
  * the attention's output times softplus(attn_gate . x) (x the block's normed input) before
    attn_output: one gate per head broadcast over its features (`attn_gate` of H rows, XS.2) or one
    per feature (H hd rows, M.1), told apart by the tensor's rows as llama.cpp's loader does;
  * sliding-window attention when `attention.sliding_window` is present and > 0 (XS.2; M.1 has none):
    llama.cpp hard-codes the pattern, full attention on layers 0, 4, 8, ... and the window on the
    others, whatever the checkpoint's `layer_types` say (llama.cpp is followed for files); sliding
    layers rotate `rope.dimension_count_swa` features at `rope.freq_base_swa` without the full
    layers' context-extension scaling (YaRN on the released full layers);
  * leading dense layers (`leading_dense_block_count`, required), then a sigmoid router with a
    selection bias (`exp_probs_b`), renormalised top-k weights times `expert_weights_scale` and one
    always-on shared expert of its own width (`expert_shared_feed_forward_length`).
The installed gguf-py has no LAGUNA architecture: the record names the file `laguna` and takes
its tensor table from gguf-py's STEP35, the same tensors (and the same Hugging Face name for the
gate, `self_attn.g_proj`) plus a `rope_freqs` Laguna files never hold. Converter: `converters.laguna`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

LAGUNA = register(Arch(
    name="laguna", tensors=MODEL_ARCH.STEP35, hf_architectures=("LagunaForCausalLM",),
    expert_gating_func="sigmoid", dense_lead=True, swa=True, swa_period=4, swa_full_first=True, swa_optional=True,
    swa_plain_rope=True, qk_norm="head", shared_expert=True, softplus_gate=True, converter="laguna",
))
