"""DeepSeek-V3.2 (`DeepseekV32ForCausalLM`) as GGUF `deepseek32`, the form llama.cpp's converter writes.

DeepSeek-V3's model (`strata.arch.deepseek2`: latent attention with the query LoRA, leading dense
layers, a shared expert, the sigmoid router with its selection bias and expert groups) plus
DeepSeek Sparse Attention: on every layer a lightning indexer (`indexer.attn_q_b` from the query
LoRA's latent, `indexer.attn_k` and its LayerNorm `indexer.k_norm` with a bias, `indexer.proj`
the per-head weights; `attention.indexer.head_count`, `.key_length`, `.top_k`) scores every
past position and the latent attention attends only over each query's top-k. The indexer's
RoPE is NEOX over the first `rope.dimension_count` features of its heads (the main attention's
is NORM); its key LayerNorm's epsilon is llama.cpp's hard-coded 1e-6. Multi-token-prediction
blocks (`nextn_predict_layers` after the trunk) are kept in the file and not run.
installed gguf-py (0.19) has no DEEPSEEK32: its tensor table is GLM_DSA's, the same names.
Converter: `converters.deepseek32`; the model maths `strata.models.dsa`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

DEEPSEEK32 = register(Arch(
    name="deepseek32", tensors=MODEL_ARCH.GLM_DSA, hf_architectures=("DeepseekV32ForCausalLM",),
    rope_type="norm", mla=True, shared_expert=True, indexer_rope="neox", indexer_norm_eps=1e-6,
    converter="deepseek32",
))
