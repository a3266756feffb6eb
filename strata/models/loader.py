"""Build a `Transformer` from a GGUF model file alone: no Hugging Face config.

Resident weights (embeddings, attention, norms, routers, shared experts, output head) are
dequantized once, by the native runtime, into the compute dtype and moved to the device; routed
experts stay in the file and are reached through the `ExpertMemory` given. Every tensor is
checked against the shape the hyperparameters imply before it is read. Which optional weights
a block has (q/k norms, biases, a shared expert and its gate) comes from the architecture's
`strata.arch` record; everything else from the file's metadata (`strata.gguf.HParams`).
"""
from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as MT

from strata import arch as archs
from strata import native
from strata.arch import Arch, weight_name
from strata.errors import StrataError, StrataFormatError
from strata.gguf import HParams, ModelFile
from strata.memory import ExpertMemory

from .attention import Attention, AttentionWeights
from .layers import FeedForward, RMSNorm, SharedExpert
from .moe import Lookahead, MoE, RoutedExperts, Router
from .rope import Rope
from .transformer import Block, Transformer


def architecture(mf: ModelFile) -> Arch:
    """The `strata.arch` record of a file, or a StrataError naming the file and what Strata runs."""
    arch = archs.get(mf.arch)
    if arch is None or not arch.runs:
        raise StrataError(f"{mf.path}: architecture {mf.arch!r} is not supported for inference "
                          f"(supported: {', '.join(archs.names(runs=True))})")
    return arch


class WeightReader:
    """Resident tensors of one file, dequantized into `dtype` on `device`, shapes checked."""

    def __init__(self, mf: ModelFile, device: torch.device, dtype: torch.dtype, n_threads: int):
        self.mf, self.device, self.dtype, self.n_threads = mf, device, dtype, n_threads

    def has(self, kind: MT, layer: int | None = None, suffix: str = "weight") -> bool:
        return weight_name(kind, layer, suffix) in self.mf.resident

    def get(self, kind: MT, layer: int | None, shape: tuple[int, ...], suffix: str = "weight") -> torch.Tensor:
        name = weight_name(kind, layer, suffix)
        info = self.mf.resident.get(name)
        if info is None:
            raise StrataFormatError(f"{self.mf.path}: tensor {name!r}: expected shape {list(shape)} "
                                    f"({self.mf.arch}), found no such tensor")
        if _squeeze(info.shape) != _squeeze(shape):  # [1, D] and [D] are the same vector
            raise StrataFormatError(f"{self.mf.path}: tensor {name!r}: expected shape {list(shape)}, "
                                    f"found {list(info.shape)}")
        out = torch.empty(shape, dtype=self.dtype)
        try:
            native.dequantize_into(info.ggml_type, self.mf.tensor_data(name), out, n_threads=self.n_threads)
        except ValueError as e:
            raise StrataFormatError(f"{self.mf.path}: tensor {name!r} ({info.ggml_type.name}): {e}") from e
        return out.to(self.device)

    def opt(self, kind: MT, layer: int | None, shape: tuple[int, ...], suffix: str = "weight") -> torch.Tensor | None:
        return self.get(kind, layer, shape, suffix) if self.has(kind, layer, suffix) else None


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _attention(w: WeightReader, arch: Arch, hp: HParams, i: int, rope: Rope) -> Attention:
    D, H, Hkv, hd = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim
    get = w.get if arch.attn_bias else w.opt  # biases are required where the architecture has them
    weights = AttentionWeights(
        wq=w.get(MT.ATTN_Q, i, (H * hd, D)), wk=w.get(MT.ATTN_K, i, (Hkv * hd, D)),
        wv=w.get(MT.ATTN_V, i, (Hkv * hd, D)), wo=w.get(MT.ATTN_OUT, i, (D, H * hd)),
        bq=get(MT.ATTN_Q, i, (H * hd,), "bias"), bk=get(MT.ATTN_K, i, (Hkv * hd,), "bias"),
        bv=get(MT.ATTN_V, i, (Hkv * hd,), "bias"))
    if arch.qk_norm:
        per_head = arch.qk_norm == "head"
        weights.q_norm = RMSNorm(w.get(MT.ATTN_Q_NORM, i, (hd,) if per_head else (H * hd,)), hp.norm_eps)
        weights.k_norm = RMSNorm(w.get(MT.ATTN_K_NORM, i, (hd,) if per_head else (Hkv * hd,)), hp.norm_eps)
        weights.qk_norm_per_head = per_head
    return Attention(weights, H, Hkv, hd, rope, i)


def _moe(w: WeightReader, arch: Arch, hp: HParams, i: int, memory: ExpertMemory) -> MoE:
    D = hp.n_embd
    router = Router(w.get(MT.FFN_GATE_INP, i, (hp.n_experts, D)), hp.n_experts_used, hp.expert_gating_func,
                    hp.expert_weights_norm, hp.expert_weights_scale)
    shared = None
    if arch.shared_expert or w.has(MT.FFN_UP_SHEXP, i):
        Is = hp.n_ff_shexp
        ffn = FeedForward(w.get(MT.FFN_GATE_SHEXP, i, (Is, D)), w.get(MT.FFN_UP_SHEXP, i, (Is, D)),
                          w.get(MT.FFN_DOWN_SHEXP, i, (D, Is)))
        gate = (w.get if arch.shared_expert_gate else w.opt)(MT.FFN_GATE_INP_SHEXP, i, (D,))
        shared = SharedExpert(ffn, gate)
    return MoE(router, RoutedExperts(memory, i), shared)


def _dense(w: WeightReader, hp: HParams, i: int) -> FeedForward:
    D, I = hp.n_embd, hp.n_ff
    return FeedForward(w.get(MT.FFN_GATE, i, (I, D)), w.get(MT.FFN_UP, i, (I, D)), w.get(MT.FFN_DOWN, i, (D, I)))


def _block(w: WeightReader, arch: Arch, hp: HParams, i: int, rope: Rope, memory: ExpertMemory | None) -> Block:
    D = hp.n_embd
    has_experts = i in w.mf.expert_layers
    if has_experts and memory is None:
        raise ValueError("the model has routed experts: load_model needs an ExpertMemory")
    ffn = _moe(w, arch, hp, i, memory) if has_experts else _dense(w, hp, i)
    return Block(RMSNorm(w.get(MT.ATTN_NORM, i, (D,)), hp.norm_eps), _attention(w, arch, hp, i, rope),
                 RMSNorm(w.get(MT.FFN_NORM, i, (D,)), hp.norm_eps), ffn)


def _add_lookahead(model: Transformer, memory: ExpertMemory, depth: int) -> None:
    """Block i announces the experts of the next `depth` MoE layers after it (routers i+1..),
    and the embeddings those of the first `depth` MoE layers."""
    moe = [(i, b) for i, b in enumerate(model.blocks) if isinstance(b.ffn, MoE)]

    def lookahead(after: int) -> Lookahead | None:
        targets = [(j, b.ffn_norm, b.ffn.router) for j, b in moe if j > after][:depth]
        return Lookahead(memory, targets) if targets else None

    model.lookahead = lookahead(-1)
    for i, block in enumerate(model.blocks):
        block.lookahead = lookahead(i)


def load_model(mf: ModelFile, memory: ExpertMemory | None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, n_threads: int | None = None) -> Transformer:
    """The model in `mf` on `device`, computing in `dtype`, routed experts through `memory`."""
    arch, hp, device = architecture(mf), mf.hparams, torch.device(device)
    w = WeightReader(mf, device, dtype, n_threads or native.default_threads())
    rope = Rope(hp, device)
    V, D = hp.vocab_size, hp.n_embd
    embedding = w.get(MT.TOKEN_EMBD, None, (V, D))
    output = w.get(MT.OUTPUT, None, (V, D)) if w.has(MT.OUTPUT) else embedding  # tied when absent
    blocks = [_block(w, arch, hp, i, rope, memory) for i in range(hp.n_layers)]
    model = Transformer(embedding, blocks, RMSNorm(w.get(MT.OUTPUT_NORM, None, (D,)), hp.norm_eps), output, rope)
    if memory is not None and memory.prefetch_depth > 0:
        _add_lookahead(model, memory, memory.prefetch_depth)
    return model


__all__ = ["WeightReader", "architecture", "load_model"]
