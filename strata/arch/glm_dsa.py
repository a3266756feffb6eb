"""GLM-5 (`GlmMoeDsaForCausalLM`) as GGUF `glm-dsa`, the form llama.cpp's converter writes.

DeepSeek-V3.2's model (`strata.arch.deepseek32`: latent attention with the query LoRA, the
lightning indexer and sparse attention over its top-k, leading dense layers, a shared expert, the
sigmoid router with its selection bias) with what llama.cpp's glm-dsa graph does otherwise:
  * the indexer's RoPE is NORM (interleaved pairs, as the main attention's), over the first
    `rope.dimension_count` features of its heads;
  * its key LayerNorm's epsilon is 0 (llama.cpp's glm-dsa loader leaves f_norm_eps unset);
  * layers whose `attention.indexer.types` entry is false ("shared", GLM-5.2) have no indexer
    tensors and keep the top-k of the full layer before them; without the key, a file of 1M
    positions or more (GLM-5.2) has full indexers on layers 0, 1 and every 4th from 2, others
    (GLM-5, 5.1) on every layer;
  * the gating function defaults to sigmoid where `expert_gating_func` is absent.
Multi-token-prediction blocks (`nextn_predict_layers` after the trunk) are kept in the file and
not run. Converter: `converters.glm_dsa`; the model maths `strata.models.dsa`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

GLM_DSA = register(Arch(
    name="glm-dsa", tensors=MODEL_ARCH.GLM_DSA, hf_architectures=("GlmMoeDsaForCausalLM",),
    rope_type="norm", mla=True, shared_expert=True, expert_gating_func="sigmoid", indexer_rope="norm",
    indexer_norm_eps=0.0, indexer_pattern=(1048576, 2, 4), converter="glm_dsa",
))
