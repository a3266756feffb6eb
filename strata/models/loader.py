"""Build a `Transformer` from a GGUF model file alone: no Hugging Face config.

Float compute: resident weights (embeddings, attention, norms, routers, shared experts, output
head) are dequantized once, by the native runtime, into the compute dtype and moved to the
device. Packed compute (the CPU): the weight matrices (embeddings, attention, shared experts,
dense FFNs, output head) are copied into RAM in their file type and multiplied by the native
quantized kernels (`PackedMatrix`); norms and routers stay float32. Routed experts stay in the
file and are reached through the `ExpertMemory` given. Must not: read expert bytes itself. Every tensor is
checked against the shape the hyperparameters imply before it is read. Which optional weights
a block has (q/k norms, biases, a shared expert and its gate) comes from the architecture's
`strata.arch` record; everything else from the file's metadata (`strata.gguf.HParams`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from gguf.constants import MODEL_TENSOR as MT

from strata import arch as archs
from strata import native
from strata.arch import Arch, weight_name
from strata.errors import StrataError, StrataFormatError
from strata.gguf import HParams, ModelFile, RopeScaling
from strata.memory import ExpertMemory
from strata.memory.parts import file_parts
from strata.quant_torch import TORCH_DEQUANT_TYPES

from . import kinds
from .layers import FeedForward, RMSNorm, SharedExpert, Weight
from .executor import NATIVE, TORCH, PackedExperts
from .expert_act import ClampedSwiGLU, InputScaled
from .packed import PackedCompute, PackedMatrix
from .moe import FloatExperts, HybridExperts, Lookahead, MoE, RoutedExperts
from .nextn import nextn_layers
from .shard import ExpertShard
from .rope import Rope
from .spec import LayerSpec, attention_spec, expert_executor, ffn_spec, layer_specs, swa_rope_differs
from .transformer import Block, Transformer


def architecture(mf: ModelFile) -> Arch:
    """The `strata.arch` record of a file, or a StrataError naming the file and what Strata runs."""
    arch = archs.get(mf.arch)
    if arch is None or not arch.runs:
        raise StrataError(f"{mf.path}: architecture {mf.arch!r} is not supported for inference "
                          f"(supported: {', '.join(archs.names(runs=True))})")
    return arch


def _supported(packed: bool) -> str:
    kind = "packed compute" if packed else "dequantization"
    return f"supported for {kind}: {', '.join(t.name for t in native.supported_types(packed))}"


def check_types(mf: ModelFile, packed: bool, cuda: bool = False) -> None:
    """Refuse, before anything is read, a tensor whose ggml type the native runtime cannot
    dequantize, or (packed compute) a routed-expert tensor it cannot multiply from its packed
    blocks, or (cuda: experts dequantized on the GPU) one the GPU dequantizer lacks: one line
    naming the file, the tensor, its type and the supported types. Resident matrices are checked
    as they are packed (`WeightReader.matrix`)."""
    for name, info in mf.tensors.items():
        t, expert = info.ggml_type, name not in mf.resident
        support = native.type_support(t)
        if not support.dequant:
            raise StrataFormatError(f"{mf.path}: tensor {name!r} is {t.name}, a ggml type Strata cannot "
                                    f"read ({_supported(False)})")
        if packed and expert and not support.packed:
            raise StrataFormatError(f"{mf.path}: expert tensor {name!r} is {t.name}, which has no packed "
                                    f"kernels ({_supported(True)}); load with compute='float'")
        if cuda and expert and t not in TORCH_DEQUANT_TYPES:
            raise StrataFormatError(f"{mf.path}: expert tensor {name!r} is {t.name}, which the GPU expert memory "
                                    f"cannot dequantize yet (on CUDA: {', '.join(x.name for x in TORCH_DEQUANT_TYPES)});"
                                    f" run it on the CPU (device='cpu')")


class WeightReader:
    """Resident tensors of one file, dequantized into `dtype` on `device`, shapes checked."""

    def __init__(self, mf: ModelFile, device: torch.device, dtype: torch.dtype, n_threads: int,
                 compute: PackedCompute | None = None):
        self.mf, self.device, self.dtype, self.n_threads, self.compute = mf, device, dtype, n_threads, compute
        # packed compute (float32 on the CPU): every layer is its kind's native executor (norms, rope,
        # cache writes, decode attention and routers native calls); float compute: the torch reference
        self.impl = TORCH if compute is None else NATIVE

    def norm(self, kind: MT, layer: int | None, shape: tuple[int, ...]) -> RMSNorm:
        return self.impl.norm(self.get(kind, layer, shape), self.mf.hparams.norm_eps)

    def matrix(self, kind: MT, layer: int | None, shape: tuple[int, ...]) -> Weight:
        """A weight matrix [N, K]: packed in its file type under packed compute, else as `get`.
        A per-head matrix [H, N, K] packs as [H*N, K], the heads' rows one after another
        (native.matmul_heads multiplies each head's rows with that head's activations)."""
        if self.compute is None:
            return self.get(kind, layer, shape)
        name = weight_name(kind, layer)
        info = self.mf.resident.get(name)
        if info is None or info.shape != tuple(shape):
            return self.get(kind, layer, shape)  # the same error `get` gives
        rows = int(np.prod(shape[:-1]))
        if not native.type_support(info.ggml_type).packed:
            raise StrataFormatError(f"{self.mf.path}: tensor {name!r} is {info.ggml_type.name}, which has no packed "
                                    f"kernels ({_supported(True)}); load with compute='float'")
        try:
            m = PackedMatrix(np.array(self.mf.tensor_data(name)), info.ggml_type, (rows, shape[-1]), self.compute)
        except ValueError as e:
            raise StrataFormatError(f"{self.mf.path}: tensor {name!r} ({info.ggml_type.name}): {e}") from e
        if len(shape) == 3:  # the per-head product's rounded activations, every head at once
            self.compute.reserve(native.matmul_heads_scratch_bytes(m.type, shape[0], self.compute.max_tokens, shape[-1]))
        return m

    def has(self, kind: MT, layer: int | None = None, suffix: str = "weight") -> bool:
        return weight_name(kind, layer, suffix) in self.mf.resident

    def get(self, kind: MT, layer: int | None, shape: tuple[int, ...], suffix: str = "weight") -> torch.Tensor:
        """suffix "": the bare name (llama.cpp's `ssm_a`)."""
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


def cache_dims(hp: HParams) -> tuple[int | tuple[int, ...], int, int]:
    """(heads, key width, value width) per position of a layer's KV cache; heads is a tuple, one
    count per layer, where layers differ (mimo2). Latent attention (kv_lora_rank > 0) keeps one
    row of [latent | rope key] and no separate values; sparse latent attention keeps its indexer
    key in the value slot (strata.models.dsa). Values narrower than keys (mimo2) are kept
    padded to the key width: the native decode attention reads one width for both (llama.cpp pads
    its V cache too where widths differ between layers)."""
    if hp.kv_lora_rank:
        return 1, hp.kv_lora_rank + hp.rope_dim, hp.indexer.head_dim if hp.indexer else 0
    return hp.kv_heads or hp.n_head_kv, hp.head_dim, max(hp.head_dim, hp.head_dim_v)


def cache_states(hp: HParams) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """Per-sequence state shapes (conv [K-1, C], ssm [Hv, dk, dv]) of each recurrent layer, for the
    KV cache to hold beside its blocks; None for a model without recurrent layers."""
    s = hp.ssm
    if s is None:
        return None
    shapes = ((s.conv_kernel - 1, s.conv_channels), (s.n_v_heads, s.head_k_dim, s.head_v_dim))
    return {i: shapes for i in range(hp.n_layers) if hp.is_recurrent(i)}


def _moe(w: WeightReader, arch: Arch, hp: HParams, spec: LayerSpec, memory: ExpertMemory, hybrid,
         shard: ExpertShard | None = None) -> MoE:
    D, E, i = hp.n_embd, hp.n_experts, spec.index
    selection_bias = w.opt(MT.FFN_EXP_PROBS_B, i, (E,), arch.selection_bias_suffix)
    # GGUF has no key for the group score: DeepSeek-V3 ("noaux_tc") always has a selection bias and
    # sums each group's top two; V2 ("group_limited_greedy") never has one and takes the best expert
    # (llama.cpp sums the top two for both, so it differs from V2's own code on grouped V2 files).
    router = w.impl.router(w.get(MT.FFN_GATE_INP, i, (E, D)), hp.n_experts_used, hp.expert_gating_func,
                    hp.expert_weights_norm, hp.expert_weights_scale, bias=w.opt(MT.FFN_GATE_INP, i, (E,), "bias"),
                    selection_bias=selection_bias, n_groups=hp.n_expert_groups, n_groups_used=hp.n_expert_groups_used,
                    group_score="top2" if selection_bias is not None else "max")
    shared = None
    if spec.ffn.shared:
        Is = hp.n_ff_shexp
        ffn = FeedForward(w.matrix(MT.FFN_GATE_SHEXP, i, (Is, D)), w.matrix(MT.FFN_UP_SHEXP, i, (Is, D)),
                          w.matrix(MT.FFN_DOWN_SHEXP, i, (D, Is)))
        gate = (w.get if arch.shared_expert_gate else w.opt)(MT.FFN_GATE_INP_SHEXP, i, (D,))
        shared = w.impl.shared(ffn, gate, w.compute)
    executor, _ = expert_executor(spec.ffn, w.compute is not None and memory.form == "packed", hybrid is not None)
    if executor == "packed":  # the fused call's scratch, sized once for a full step
        parts, c = file_parts(w.mf, i), w.compute
        c.reserve(native.moe_scratch_bytes(parts, c.max_tokens, c.max_tokens * hp.n_experts_used))
    expert_fn = None
    if arch.expert_bias or arch.swiglu_clamp:
        I, (alpha, limit) = hp.n_ff_exp, arch.swiglu_clamp or (1.0, float("inf"))
        expert_fn = ClampedSwiGLU(w.get(MT.FFN_GATE_EXP, i, (E, I), "bias"), w.get(MT.FFN_UP_EXP, i, (E, I), "bias"),
                                  w.get(MT.FFN_DOWN_EXP, i, (E, D), "bias"), alpha, limit)
    elif arch.expert_input_scaled:
        expert_fn = InputScaled()
    if shard is not None and (executor == "hybrid" or shard.n_experts != E):
        raise ValueError(f"layer {i}: an expert shard of {shard.n_experts} experts for {E} experts"
                         f"{' with hybrid compute' if executor == 'hybrid' else ''}")
    if executor == "packed":
        experts = PackedExperts(memory, i, E, w.compute, expert_fn, shard)
    elif executor == "hybrid":
        experts = HybridExperts(memory, i, E, hybrid, expert_fn)
    else:
        experts = FloatExperts(memory, i, E, expert_fn, shard)
    return MoE(router, RoutedExperts(experts), shared)


def _dense(w: WeightReader, hp: HParams, i: int) -> FeedForward:
    D, I = hp.n_embd, hp.n_ff
    return FeedForward(w.matrix(MT.FFN_GATE, i, (I, D)), w.matrix(MT.FFN_UP, i, (I, D)),
                       w.matrix(MT.FFN_DOWN, i, (D, I)))


def rope_factors(w: WeightReader, hp: HParams) -> torch.Tensor | None:
    """The frequency factors [rope_dim/2] the file's RoPE divides by, as llama.cpp's
    get_rope_factors picks them: `rope_freqs` (Llama 3's), else under longrope the long set when
    the model's context exceeds the original one, else the short set; None without."""
    shape, s = (hp.rope_dim // 2,), hp.rope_scaling
    w = WeightReader(w.mf, torch.device("cpu"), torch.float32, w.n_threads)  # float32, whatever the compute
    if w.has(MT.ROPE_FREQS):
        return w.get(MT.ROPE_FREQS, None, shape)
    if s.type != "longrope":
        return None
    kind = MT.ROPE_FACTORS_LONG if hp.context_length > s.original_context_length else MT.ROPE_FACTORS_SHORT
    return w.get(kind, None, shape)  # longrope without its factors: the missing tensor named


def layer_ropes(w: WeightReader, hp: HParams, device: torch.device) -> list[Rope]:
    """Each layer's RoPE: one shared table, and a second for sliding-window layers when they rotate
    otherwise (spec.swa_rope_differs): their own base (`rope.freq_base_swa`, llama.cpp's
    get_rope_freq_base), rotary features (`rope.dimension_count_swa`) or, Laguna, no scaling."""
    factors = rope_factors(w, hp)
    full = Rope(hp, device, factors)
    arch = archs.get(hp.arch)
    if not swa_rope_differs(hp, arch):
        return [full] * hp.n_layers
    own = dataclasses.replace(hp, rope_dim=hp.rope_dim_swa,
                              rope_scaling=RopeScaling() if arch.swa_plain_rope else hp.rope_scaling)
    swa = Rope(own, device, factors if hp.rope_dim_swa == hp.rope_dim else None, hp.rope_freq_base_swa)
    return [swa if hp.is_swa(i) else full for i in range(hp.n_layers)]


def _ffn(w: WeightReader, arch: Arch, hp: HParams, spec: LayerSpec, memory: ExpertMemory | None,
         hybrid=None, shards: dict[int, ExpertShard] | None = None) -> tuple[RMSNorm, MoE | FeedForward | SharedExpert]:
    """Block i's FFN norm and FFN (routed experts, or a dense FFN; `shards`: this rank's part of
    each MoE layer under expert parallelism)."""
    i = spec.index
    if spec.ffn.moe and memory is None:
        raise ValueError("the model has routed experts: load_model needs an ExpertMemory")
    ffn = _moe(w, arch, hp, spec, memory, hybrid, (shards or {}).get(i)) if spec.ffn.moe else _dense(w, hp, i)
    if not spec.ffn.moe and w.compute is not None:  # packed: the dense FFN as a one-expert fused call (the program's form)
        ffn = w.impl.shared(ffn, None, w.compute)
    ffn_norm = MT.ATTN_POST_NORM if arch.post_attention_norm else MT.FFN_NORM  # gpt-oss's name for it
    return w.norm(ffn_norm, i, (hp.n_embd,)), ffn


def _block(w: WeightReader, arch: Arch, hp: HParams, spec: LayerSpec, rope: Rope, ffn: tuple,
           lookahead: Lookahead | None = None) -> Block:
    """Block spec.index; `ffn`: its (FFN norm, FFN) (`_ffn`)."""
    norm, ffn = ffn
    return Block(w.norm(MT.ATTN_NORM, spec.index, (hp.n_embd,)), kinds.build(spec, w, arch, hp, rope), norm, ffn,
                 lookahead)


def layer_block(w: WeightReader, arch: Arch, hp: HParams, i: int, rope: Rope, memory: ExpertMemory | None) -> Block:
    """Block i alone, its spec from the reader's file records (calibration builds layers one at a
    time, without a look-ahead)."""
    spec = LayerSpec(i, hp.norm_eps, attention_spec(w.mf, arch, i), ffn_spec(w.mf, arch, i))
    return _block(w, arch, hp, spec, rope, _ffn(w, arch, hp, spec, memory))


def _lookaheads(memory: ExpertMemory | None, specs: list[LayerSpec],
                ffns: list[tuple[RMSNorm, torch.nn.Module]]) -> list[Lookahead | None]:
    """The look-ahead of the embeddings (first) and of each block after its attention half: the
    experts of the next `prefetch_depth` MoE layers (their routers) to the memory's prefetcher; all
    None when the memory takes no announcements (no prefetcher)."""
    prefetcher = None if memory is None else memory.prefetcher
    if prefetcher is None:
        return [None] * (len(ffns) + 1)
    depth, correction = prefetcher.prefetch_depth, prefetcher.lookahead_correction  # one learned map, shared
    moe = [(j, norm, ffn.router) for j, (norm, ffn) in enumerate(ffns) if specs[j].ffn.moe]
    own = {j: (norm, router) for j, norm, router in moe}
    owned = {j: ffns[j][1].experts.shard.owned for j, _, _ in moe  # expert parallelism: this rank's
             if ffns[j][1].experts.shard is not None}
    if owned:  # the memory's own predictors drop the other ranks' experts too
        prefetcher.restrict({j: mask.numpy() for j, mask in owned.items()})

    def after(i: int) -> Lookahead | None:
        targets = [t for t in moe if t[0] > i][:depth]
        learns = correction is not None and i in own  # the last MoE layer's logits are a target to learn
        return Lookahead(prefetcher, targets, i, correction, own.get(i), owned) if targets or learns else None

    return [after(i) for i in range(-1, len(ffns))]


def load_model(mf: ModelFile, memory: ExpertMemory | None, *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, n_threads: int | None = None,
               compute: str = "float", hybrid=None, shards: dict[int, ExpertShard] | None = None) -> Transformer:
    """The model in `mf` on `device`, computing in `dtype`, routed experts through `memory`.

    compute: "float" (weights dequantized into `dtype`) or "packed" (the CPU only, float32
    activations: weight matrices stay in their file type, the native kernels multiply; routed
    experts too when the memory's form is "packed"). hybrid: the CPU side of hybrid compute
    (`strata.runtime.hybrid.HybridCompute`, built by the runtime when its plan says so) that plain
    routed experts hand their chunks to, or None. shards: under expert parallelism, this rank's
    `ExpertShard` of each MoE layer (by layer index). The fast decode paths are the runtime's
    (`strata.runtime`): this builds the maths only."""
    arch, device = architecture(mf), torch.device(device)
    n_threads = n_threads or native.default_threads()
    if compute not in ("float", "packed"):
        raise StrataError(f"compute must be 'float' or 'packed', found {compute!r}")
    if compute == "packed" and (device.type != "cpu" or dtype != torch.float32):
        raise StrataError(f"packed compute runs on the CPU in float32, not on {device} in {dtype}")
    check_types(mf, compute == "packed" and memory is not None and memory.form == "packed",
                cuda=memory is not None and memory.cuda_slots)
    packed = PackedCompute(n_threads) if compute == "packed" else None
    try:
        return _build(mf, memory, arch, device, dtype, n_threads, packed, hybrid, shards)
    except BaseException:
        if packed is not None:  # its pool's threads would outlive the failed load
            packed.close()
        raise


def _build(mf: ModelFile, memory: ExpertMemory | None, arch: Arch, device: torch.device, dtype: torch.dtype,
           n_threads: int, packed: PackedCompute | None, hybrid, shards=None) -> Transformer:
    hp = mf.hparams
    w = WeightReader(mf, device, dtype, n_threads, packed)
    ropes = layer_ropes(w, hp, device)
    V, D = hp.vocab_size, hp.n_embd
    embedding = w.matrix(MT.TOKEN_EMBD, None, (V, D))
    output = w.matrix(MT.OUTPUT, None, (V, D)) if w.has(MT.OUTPUT) else embedding  # tied when absent
    if shards and set(shards) != set(mf.expert_layers):
        raise StrataError(f"{mf.path}: expert shards of layers {sorted(shards)} for expert layers {mf.expert_layers}")
    specs = layer_specs(mf, arch)
    ffns = [_ffn(w, arch, hp, spec, memory, hybrid, shards) for spec in specs]  # (ffn norm, ffn) of each block
    hooks = _lookaheads(memory, specs, ffns)  # the embeddings', then each block's
    blocks = [_block(w, arch, hp, spec, ropes[spec.index], ffns[spec.index], hooks[spec.index + 1]) for spec in specs]
    return Transformer(embedding, blocks, w.norm(MT.OUTPUT_NORM, None, (D,)), output, ropes[0], specs, compute=packed,
                       lookahead=hooks[0], nextn=nextn_layers(mf.nextn, mf.tensor_data))  # MTP blocks: kept, not run


__all__ = ["WeightReader", "architecture", "cache_dims", "cache_states", "check_types", "layer_block", "layer_ropes",
           "load_model", "rope_factors"]
