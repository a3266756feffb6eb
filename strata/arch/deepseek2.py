"""DeepSeek-V3 and -V2 (`DeepseekV3ForCausalLM`, `DeepseekV2ForCausalLM`) as GGUF `deepseek2`, the
form llama.cpp's converter writes.

Multi-head latent attention (kv_lora_rank required; query LoRA optional) stored for the latent
decode form: `kv_b` split into per-head `attn_k_b` [H, kv_lora, nope] and `attn_v_b`
[H, v, kv_lora], key_length = kv_lora + rope, value_length = kv_lora, one KV "head"; leading
dense layers (required count); shared experts without a gate; sigmoid router with a selection
bias (`exp_probs_b`), group-limited top-k, renormalised weights times the routed scaling factor
(V3); softmax router, no selection bias, groups scored by their best expert (V2).
llama.cpp's rope type for it is NORM: the checkpoint's rotary features are interleaved pairs.
Its converter is `converters.deepseek2`; the model maths `strata.models.mla`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

DEEPSEEK2 = register(Arch(
    name="deepseek2", tensors=MODEL_ARCH.DEEPSEEK2, hf_architectures=("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"),
    rope_type="norm", dense_lead=True, mla=True, shared_expert=True, converter="deepseek2",
))
