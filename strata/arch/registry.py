"""The architecture registry: one `Arch` record per GGUF architecture, and lookups.

A record says everything about an architecture that its GGUF metadata does not: which of
gguf-py's tensor tables names its tensors, which Hugging Face checkpoints become it, how
llama.cpp's graph rotates, routes and normalises it, and which optional weights it has. It is
read by `strata.gguf.hparams` (defaults of absent keys), `strata.models.loader` (which weights
each block has) and `converters` (what to write). Plain data over gguf-py's constants: this
module imports nothing else, so every layer may read it; it must not grow behaviour.
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import MODEL_ARCH, MODEL_TENSOR

ROPE_TYPES = ("norm", "neox")  # llama_model_rope_type: adjacent pairs | the two halves of each head
QK_NORMS = (None, "head", "full")  # RMSNorm of q and k before RoPE: none | over hd | over all heads
GATING_FUNCS = ("softmax", "sigmoid", "softmax_weight")  # llama_expert_gating_func_type names


@dataclass(frozen=True)
class Arch:
    """One architecture. Fields below the first blank line are defaults llama.cpp's loader
    assumes when a metadata key is absent; the last group is read by the converter only."""

    name: str  # GGUF general.architecture, and the `{arch}.` prefix of its metadata keys
    tensors: MODEL_ARCH  # gguf-py's architecture whose tensor-name table and order the file uses (with
    #                      `tensor_set`: the installed gguf-py's closest one, whose HF-name overrides apply)
    tensor_set: tuple[MODEL_TENSOR, ...] = ()  # llama.cpp's tensor list, in its order, for an architecture the
    #                                            installed gguf-py lacks (`tensor_names.tensor_kinds`)
    hf_architectures: tuple[str, ...] = ()  # config.json `architectures` converted to it (none: no converter)
    hf_multimodal: tuple[str, ...] = ()  # ... whose checkpoint holds it as the language model beside a vision
    #                                      tower (text_config, language_model.* weights): converted text only
    runs: bool = True  # strata.models builds it (False: Strata reads its hyperparameters only)

    rope_type: str = "neox"
    rope_factors: bool = False  # llama.cpp's graph divides RoPE frequencies by `rope_freqs` (Llama 3's scaling) or
    # longrope's factor sets (its get_rope_factors): the converter writes them for llama3 / longrope configs
    moe: bool = True  # expert_count and expert_used_count are required (a dense llama has neither)
    expert_gating_func: str = "softmax"  # router probabilities when `{arch}.expert_gating_func` is absent
    expert_weights_norm: bool = False  # top-k weights renormalised when `{arch}.expert_weights_norm` is absent
    dense_lead: bool = False  # `{arch}.leading_dense_block_count` is required (leading dense FFN layers)
    mla: bool = False  # multi-head latent attention: attention.kv_lora_rank is required
    swa: bool = False  # sliding-window attention: attention.sliding_window is required
    swa_period: int = 0  # without attention.sliding_window_pattern: layers i with i % swa_period < swa_period - 1 slide
    swa_full_first: bool = False  # ... instead layers i with i % swa_period != 0 slide (llama.cpp's dense_first)
    swa_optional: bool = False  # attention.sliding_window may be absent (or 0): then every layer attends in full
    swa_plain_rope: bool = False  # sliding layers rotate without the context-extension scaling of the full ones

    qk_norm: str | None = None  # one of QK_NORMS
    qk_norm_optional: bool = False  # the q/k norms apply only where the file has them (per layer)
    attn_bias: bool = False  # q, k and v projections have biases
    shared_expert: bool = False  # every MoE layer has an always-on shared expert (ffn_*_shexp)
    shared_expert_gate: bool = False  # ... scaled by sigmoid(ffn_gate_inp_shexp . x)
    attn_sinks: bool = False  # a learned per-head logit joins each softmax (attn_sinks), then is dropped
    attn_out_bias: bool = False  # the attention output projection has a bias
    softplus_gate: bool = False  # attention output *= softplus(attn_gate . x) before attn_output, per head or element
    post_attention_norm: bool = False  # the FFN's pre-norm is stored as `post_attention_norm`, not `ffn_norm`
    expert_bias: bool = False  # routed experts' gate, up and down have biases (ffn_*_exps.bias)
    router_bias: bool = False  # the router has a bias (ffn_gate_inp.bias)
    selection_bias_suffix: str = "bias"  # the router's selection bias is `blk.N.exp_probs_b.<this>` ("": bare name)
    swiglu_clamp: tuple[float, float] | None = None  # (alpha, limit) of the clamped SwiGLU llama.cpp hard-codes
    chunked: "ChunkedAttn | None" = None  # chunked local attention, NoPE layers, temperature (llama4)
    expert_input_scaled: bool = False  # the router weight scales each expert's input, not its output
    gated_deltanet: bool = False  # recurrent gated-DeltaNet layers between gated full-attention ones (qwen3next)
    deltanet_tiled: bool = False  # ... value heads tiled over key heads (head j reads key head j % Hk), ssm_beta and
    #                               ssm_alpha apart (qwen35moe: llama.cpp's converter reorders the value heads)
    rope_sections: bool = False  # `rope.dimension_sections` (interleaved multimodal RoPE) is required
    indexer_rope: str | None = None  # DeepSeek Sparse Attention: the lightning indexer's RoPE arrangement (one of
    #                                  ROPE_TYPES; `attention.indexer.*` are required), None without an indexer
    indexer_norm_eps: float = 0.0  # the epsilon of the indexer key's LayerNorm (llama.cpp's f_norm_eps)
    indexer_pattern: tuple[int, int, int] | None = None  # (context, lead, period): without `attention.indexer.types`,
    #                                  a file of at least `context` positions runs its own indexer on the first `lead`
    #                                  layers and every `period`-th after them, the others reuse it (else all run it)

    permute_qk: bool = False  # Q/K rows go from rotate-half to adjacent pairs (NORM RoPE on a NEOX checkpoint)
    metadata: tuple[str, ...] = ()  # gguf-py `Keys.LLM` templates written beyond the common ones
    same_kv_heads: bool = False  # llama.cpp's graph needs num_key_value_heads == num_attention_heads
    refused_config: tuple[str, ...] = ()  # config.json keys that must be absent or null (unsupported features)
    converter: str | None = None  # module of `converters` whose CONVERTER subclass converts it (None: the generic one)

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"architecture {self.name!r}: rope_type {self.rope_type!r}, expected one of {ROPE_TYPES}")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"architecture {self.name!r}: qk_norm {self.qk_norm!r}, expected one of {QK_NORMS}")
        if self.expert_gating_func not in GATING_FUNCS:
            raise ValueError(f"architecture {self.name!r}: expert_gating_func {self.expert_gating_func!r}, "
                             f"expected one of {GATING_FUNCS}")
        if self.indexer_rope not in (None, *ROPE_TYPES):
            raise ValueError(f"architecture {self.name!r}: indexer_rope {self.indexer_rope!r}, expected one of "
                             f"{ROPE_TYPES}")
        if self.indexer_rope and not self.mla:
            raise ValueError(f"architecture {self.name!r}: a sparse-attention indexer without latent attention")
        if self.shared_expert_gate and not self.shared_expert:
            raise ValueError(f"architecture {self.name!r}: shared_expert_gate without shared_expert")


@dataclass(frozen=True)
class ChunkedAttn:
    """Chunked local attention beside NoPE global layers, as llama.cpp's llama4 loader assumes it.
    Layer i is global (full causal attention, no RoPE, queries scaled by the temperature) when
    (i + 1) % nope_period == 0, else local: RoPE, attention within its chunk of `chunk` positions
    (`attention.sliding_window`; llama.cpp fixes 8192 whatever the key says, and reads 0 as no
    chunks and RoPE everywhere), then an L2 (weightless RMS) norm of q and k unless the model has
    `no_qk_norm_experts` experts. Temperature: q *= 1 + scale * ln(floor((pos + 1) / floor) + 1)
    (`attention.temperature_scale` / `temperature_length`; llama.cpp fixes 0.1 and 8192)."""

    chunk: int = 8192
    nope_period: int = 4
    temperature_floor: int = 8192
    temperature_scale: float = 0.1
    no_qk_norm_experts: int = 128


_BY_NAME: dict[str, Arch] = {}
_BY_HF: dict[str, Arch] = {}


def register(arch: Arch) -> Arch:
    """Add `arch`; its GGUF name and HF architectures must be new. Returns it."""
    if arch.name in _BY_NAME:
        raise ValueError(f"architecture {arch.name!r} is already registered")
    taken = [hf for hf in arch.hf_architectures + arch.hf_multimodal if hf in _BY_HF]
    if taken:
        raise ValueError(f"architecture {arch.name!r}: {', '.join(taken)} already convert to "
                         f"{_BY_HF[taken[0]].name!r}")
    _BY_NAME[arch.name] = arch
    _BY_HF.update(dict.fromkeys(arch.hf_architectures + arch.hf_multimodal, arch))
    return arch


def unregister(name: str) -> None:
    """Remove the architecture registered as `name` (KeyError if there is none)."""
    arch = _BY_NAME.pop(name)
    for hf in arch.hf_architectures + arch.hf_multimodal:
        del _BY_HF[hf]


def get(name: str) -> Arch | None:
    """The architecture whose GGUF `general.architecture` is `name`, or None."""
    return _BY_NAME.get(name)


def for_hf(hf_architecture: str) -> Arch | None:
    """The architecture a checkpoint with config.json `architectures: [hf_architecture]` becomes."""
    return _BY_HF.get(hf_architecture)


def names(*, runs: bool | None = None) -> list[str]:
    """GGUF names of the registered architectures, sorted (only those that run, or not, if asked)."""
    return sorted(n for n, a in _BY_NAME.items() if runs is None or a.runs == runs)


def hf_names() -> list[str]:
    """Every HF architecture some registered architecture converts, in registration order."""
    return list(_BY_HF)


__all__ = ["Arch", "ChunkedAttn", "for_hf", "get", "hf_names", "names", "register", "unregister"]
