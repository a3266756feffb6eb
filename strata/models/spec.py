"""The layer spec: one frozen description of each layer, built once at load from the architecture's
`Arch` record, the file's hyperparameters and its tensor types, before any weight is read.

    specs = layer_specs(mf, arch)            # [LayerSpec] of every layer
    specs[3].attention.kind                  # "gqa", "gated", "chunked", "mla", "dsa" or "deltanet"
    specs[3].unfused()                       # why the native decode step cannot compute it (None: it can)

Both implementations of a layer read it: the torch reference (strata.models: attention.py, mla.py,
dsa.py, chunked.py, deltanet.py, moe.py) and the native executor (strata.models.executor). The plan
(strata.runtime.plan) reads what each layer allows from the specs, never from built objects.
Must not: read tensor bytes (types and shapes from the file's records only).
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import MODEL_TENSOR as MT

from strata.arch import Arch, weight_name

#: Attention kinds, one implementation pair each (torch reference, native executor).
GQA, GATED, CHUNKED, MLA, DELTANET, DSA = "gqa", "gated", "chunked", "mla", "deltanet", "dsa"
ATTENTION_KINDS = (GQA, GATED, CHUNKED, MLA, DELTANET, DSA)

#: Expert functions: plain SwiGLU, gpt-oss's biased and clamped SwiGLU, Llama 4's input-scaled one.
SWIGLU, CLAMPED, INPUT_SCALED = "swiglu", "clamped", "input_scaled"


@dataclass(frozen=True)
class AttentionSpec:
    """A layer's attention half. kind: one of ATTENTION_KINDS. window: sliding window (0: none);
    own_rope: the layer rotates by a RoPE of its own (sliding-window layers: `swa_rope_differs`);
    sinks: per-head sink logits (gpt-oss); chunk, nope, l2_eps, temperature: Llama 4's chunked
    attention; q_lora, kv_lora, latent_split, temperature: latent attention (latent_split: the file
    holds k_b and v_b, not an older converter's kv_b); stacked: packed q, k (and v) share one type,
    so they stack into one product (deltanet: the input projections do); head_dim_v: the value heads'
    width where it is not head_dim (0: head_dim; mimo2: narrower, the cache's value rows padded to
    head_dim, as the native decode attention reads one width), v_scale: the values (the attention's
    output) scaled (mimo2); out_gate: Laguna's softplus output gate of its own projection, "head"
    (one value per head) or "element" ("": none). n_head and n_head_kv are the layer's own (Laguna's
    per-layer query heads, mimo2's per-layer kv heads). index_topk, index_shared: sparse latent
    attention (DSA), the positions each query keeps and whether the layer reuses the previous full
    layer's choice rather than running its own indexer."""

    kind: str
    n_head: int = 0
    n_head_kv: int = 0
    head_dim: int = 0
    window: int = 0
    own_rope: bool = False
    sinks: bool = False
    chunk: int = 0
    nope: bool = False
    head_dim_v: int = 0
    v_scale: float = 1.0
    l2_eps: float | None = None
    temperature: bool = False
    q_lora: int = 0
    kv_lora: int = 0
    latent_split: bool = True
    stacked: bool = True
    index_topk: int = 0
    index_shared: bool = False
    out_gate: str = ""

    def unfused(self) -> str | None:
        """Why the native decode step cannot compute this attention half (None: it can)."""
        if self.kind in (MLA, DSA) and self.temperature:
            return "latent attention with a query temperature (the native step has none)"
        if self.kind in (MLA, DSA) and not self.latent_split:
            return "latent attention from an older converter's kv_b (k_b and v_b unpacked)"
        if not self.stacked:
            return f"{self.kind} attention whose input projections have different types (no one product)"
        return None


@dataclass(frozen=True)
class FfnSpec:
    """A layer's feed-forward half. kind "moe" (routed experts) or "dense". gating, n_used,
    grouped: the router (grouped: expert groups compete first); act: the experts' function
    (SWIGLU, CLAMPED, INPUT_SCALED); shared, shared_gate: an always-on shared expert and its gate."""

    kind: str
    n_experts: int = 0
    n_used: int = 0
    gating: str = "softmax"
    grouped: bool = False
    act: str = SWIGLU
    shared: bool = False
    shared_gate: bool = False

    @property
    def moe(self) -> bool:
        return self.kind == "moe"

    def unfused(self) -> str | None:
        """Why the native decode step cannot route this layer (None: it can)."""
        if self.moe and self.grouped and self.gating == "softmax_weight":
            return "expert groups beside softmax_weight gating (torch routes them)"
        return None


@dataclass(frozen=True)
class LayerSpec:
    """Layer `index`: its norms' epsilon, its attention half and its feed-forward half."""

    index: int
    norm_eps: float
    attention: AttentionSpec
    ffn: FfnSpec

    def unfused(self) -> str | None:
        """Why the native decode step cannot compute this layer (None: it can)."""
        return self.attention.unfused() or self.ffn.unfused()


def expert_executor(ffn: FfnSpec, packed: bool, hybrid: bool) -> tuple[str, str]:
    """(executor, why) of a MoE layer's routed experts: "packed" (packed compute over a memory that
    hands out packed experts: the native fused call), "hybrid" (the memory splits missed experts
    between the device and the CPU: plain or input-scaled SwiGLU only) or "float" (float experts
    from the memory, one GEMM each). The loader builds what this says; the plan shows it."""
    if packed:
        return "packed", "packed compute: the native fused call runs the memory's packed experts"
    if hybrid and ffn.act != CLAMPED:
        return "hybrid", "the memory splits missed experts between the device and the CPU"
    if hybrid:
        return "float", f"{ffn.act} experts have no CPU side: they run on the device from the memory alone"
    return "float", "float experts from the memory, one GEMM each"


def _types_equal(mf, kinds: list[MT], layer: int) -> bool:
    """Whether the named resident tensors of `layer` all have one ggml type."""
    types = {mf.resident[n].ggml_type for n in (weight_name(k, layer) for k in kinds) if n in mf.resident}
    return len(types) <= 1


def attention_spec(mf, arch: Arch, i: int) -> AttentionSpec:
    hp = mf.hparams
    if arch.mla:
        sparse = dict(index_topk=hp.indexer.top_k, index_shared=not hp.indexer.full[i]) if hp.indexer else {}
        return AttentionSpec(DSA if hp.indexer else MLA, hp.n_head, 1, hp.kv_lora_rank + hp.rope_dim,
                             q_lora=hp.q_lora_rank, kv_lora=hp.kv_lora_rank,
                             temperature=bool(hp.attn_temperature_scale),
                             latent_split=weight_name(MT.ATTN_K_B, i) in mf.resident
                             or weight_name(MT.ATTN_KV_B, i) not in mf.resident, **sparse)
    if arch.gated_deltanet and hp.is_recurrent(i):
        ins = [MT.ATTN_QKV, MT.ATTN_GATE, *((MT.SSM_BETA, MT.SSM_ALPHA) if arch.deltanet_tiled else (MT.SSM_BETA_ALPHA,))]
        return AttentionSpec(DELTANET, stacked=_types_equal(mf, ins, i))
    common = dict(n_head=hp.head_count(i), n_head_kv=hp.head_count_kv(i), head_dim=hp.head_dim,
                  stacked=_types_equal(mf, [MT.ATTN_Q, MT.ATTN_K], i))
    if arch.gated_deltanet:
        return AttentionSpec(GATED, **common)
    if arch.chunked:
        nope = hp.is_nope(i)
        return AttentionSpec(CHUNKED, chunk=0 if nope else hp.attn_chunk, nope=nope,
                             l2_eps=hp.norm_eps if hp.qk_l2_norm else None,
                             temperature=nope and bool(hp.attn_temperature_scale), **common)
    swa = hp.is_swa(i)
    return AttentionSpec(GQA, window=hp.sliding_window if swa else 0,
                         sinks=arch.attn_sinks or weight_name(MT.ATTN_SINKS, i) in mf.resident,
                         own_rope=swa and swa_rope_differs(hp, arch), out_gate=_out_gate(mf, arch, i),
                         head_dim_v=0 if hp.head_dim_v == hp.head_dim else hp.head_dim_v, v_scale=hp.attn_value_scale,
                         **common)


def swa_rope_differs(hp, arch: Arch) -> bool:
    """Whether sliding-window layers rotate otherwise than full ones (a table of their own): their
    own base or rotary features, or (`Arch.swa_plain_rope`) no scaling where full layers have some."""
    s = hp.rope_scaling
    scaled = s.type != "none" or s.attn_factor not in (None, 1.0)
    return hp.rope_freq_base_swa != hp.rope_freq_base or hp.rope_dim_swa != hp.rope_dim or (arch.swa_plain_rope and scaled)


def _out_gate(mf, arch: Arch, i: int) -> str:
    """Laguna's output gate of layer i: "head" when attn_gate has a row per query head (or is
    missing: the reader names it), else "element"; "" for an architecture without one."""
    if not arch.softplus_gate:
        return ""
    info = mf.resident.get(weight_name(MT.ATTN_GATE, i))
    return "head" if info is None or info.shape[0] == mf.hparams.head_count(i) else "element"


def ffn_spec(mf, arch: Arch, i: int) -> FfnSpec:
    hp = mf.hparams
    if i not in mf.expert_layers:
        return FfnSpec("dense")
    act = CLAMPED if arch.expert_bias or arch.swiglu_clamp else INPUT_SCALED if arch.expert_input_scaled else SWIGLU
    groups = hp.n_expert_groups
    return FfnSpec("moe", hp.n_experts, hp.n_experts_used, hp.expert_gating_func,
                   grouped=1 < groups and hp.n_expert_groups_used < groups, act=act,
                   shared=arch.shared_expert or weight_name(MT.FFN_UP_SHEXP, i) in mf.resident,
                   shared_gate=arch.shared_expert_gate or weight_name(MT.FFN_GATE_INP_SHEXP, i) in mf.resident)


def layer_specs(mf, arch: Arch) -> list[LayerSpec]:
    """The spec of every layer of the model in `mf` (a `ModelFile` of architecture `arch`)."""
    hp = mf.hparams
    return [LayerSpec(i, hp.norm_eps, attention_spec(mf, arch, i), ffn_spec(mf, arch, i)) for i in range(hp.n_layers)]


__all__ = ["ATTENTION_KINDS", "AttentionSpec", "CHUNKED", "CLAMPED", "DELTANET", "DSA", "FfnSpec", "GATED", "GQA",
           "INPUT_SCALED", "LayerSpec", "MLA", "SWIGLU", "attention_spec", "expert_executor", "ffn_spec",
           "layer_specs", "swa_rope_differs"]
