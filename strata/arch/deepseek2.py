"""DeepSeek-V2/V3 as GGUF `deepseek2`, hyperparameters only (Strata does not build it yet).

Multi-head latent attention (kv_lora_rank required), leading dense layers (required count),
shared experts without a gate. llama.cpp's rope type for it is NORM: its converter keeps the
checkpoint's interleaved rotary layout. V3's sigmoid routing comes from expert_gating_func.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

DEEPSEEK2 = register(Arch(
    name="deepseek2", tensors=MODEL_ARCH.DEEPSEEK2, runs=False,
    rope_type="norm", dense_lead=True, mla=True, shared_expert=True,
))
