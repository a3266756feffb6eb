"""Xiaomi MiMo-V2-Flash (`MiMoV2FlashForCausalLM`) as GGUF `mimo2`, the form llama.cpp's converter
writes.

Grouped-query attention with per-layer sizes: full-attention layers and sliding-window ones
(`attention.sliding_window_pattern`, one flag per block) differ in their kv heads
(`attention.head_count_kv` is an array, one count per block: the released model doubles them on
sliding layers) and in their RoPE base (`rope.freq_base_swa`); sliding layers have attention
sinks, full ones none (sinks wherever the file has `attn_sinks`). Keys and values have their own
head widths (`attention.key_length` 192, `attention.value_length` 128 in the released model) and
the values are scaled by `attention.value_scale` (llama.cpp scales the attention's output, after
the output projection: the same maths). NEOX RoPE over the first `rope.dimension_count` features
of each head (partial_rotary_factor). Dense FFN where a block has no router (the first, in the
released model), else experts under a sigmoid router with a selection bias (`exp_probs_b`),
top-k weights renormalised; llama.cpp's graph fixes the sigmoid and the renormalisation whatever
the metadata says, and so do these defaults. Multi-token-prediction blocks
(`nextn_predict_layers` after the trunk: `blk.N.nextn.*` beside a dense SWA-shaped block) are
kept on the model, not run. Converter: `converters.mimo2`.

A record only: must not hold model maths or read files.
"""
from gguf.constants import MODEL_ARCH

from .registry import Arch, register

MIMO2 = register(Arch(
    name="mimo2", tensors=MODEL_ARCH.MIMO2, hf_architectures=("MiMoV2FlashForCausalLM",),
    expert_gating_func="sigmoid", expert_weights_norm=True, swa=True, converter="mimo2",
))
