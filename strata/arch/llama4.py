"""Llama 4 Scout / Maverick, text part (`Llama4ForCausalLM`, and the text model of the released
multimodal `Llama4ForConditionalGeneration`), as GGUF `llama4` (llama.cpp's form).

Layers interleave dense SwiGLU FFNs and MoE FFNs (every `interleave_moe_layer_step`-th layer,
from the tensors); MoE layers add an always-on shared expert (no gate) to one routed expert chosen
by top-k of the router logits and weighted by their sigmoid, the weight scaling the expert's
INPUT. Attention: three chunked local layers with RoPE (adjacent pairs, no Q/K permutation) and
an L2 qk-norm, then one global NoPE layer with temperature-tuned queries (`ChunkedAttn`).
Converter: `converters.llama4`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH, Keys

from .registry import Arch, ChunkedAttn, register

LLAMA4 = register(Arch(
    name="llama4", tensors=MODEL_ARCH.LLAMA4, hf_architectures=("Llama4ForCausalLM",),
    hf_multimodal=("Llama4ForConditionalGeneration",),
    rope_type="norm", rope_factors=True, expert_gating_func="sigmoid", shared_expert=True,
    chunked=ChunkedAttn(), expert_input_scaled=True, converter="llama4",
    metadata=(Keys.LLM.VOCAB_SIZE, Keys.Rope.DIMENSION_COUNT, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH),
))
