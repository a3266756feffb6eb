"""One decoder layer at a time over the calibration tokens, with Strata's own model code.

A layer is built by `strata.models.loader` from float tensors held in a dict (GGUF names), so
every architecture the engine runs calibrates with the maths the engine uses. Each weight matrix
is wrapped in a `Recorder`, which accumulates the Hessian H = X^T X of its inputs (a matrix's
input rows: every token for attention and shared experts, only the tokens routed to it for an
expert) before computing the product. Matrices that read the same input (q/k/v; an expert's gate
and up) share one accumulator. The routed experts are reached through `LayerExperts`, an
`ExpertMemory` holding one layer's experts in RAM that also counts the routing it sees.

Memory: one layer's float weights, the Hessians of its matrices and the hidden states of the
calibration tokens [N, D]. Must not: quantize or write files (the pipeline does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT

from strata.arch import Arch, weight_name
from strata.gguf import HParams
from strata.memory import ExpertMemory
from strata.memory.base import ExpertWeights
from strata.models.batch import Batch
from strata.quant import GGMLType
from strata.models.layers import FeedForward
from strata.models.executor import TORCH
from strata.models.loader import WeightReader, cache_dims, layer_block
from strata.models.moe import MoE
from strata.models.rope import Rope

#: Matrix attributes of attention weights (grouped-query and latent) and their tensor kinds.
_ATTN = {"wq": MT.ATTN_Q, "wk": MT.ATTN_K, "wv": MT.ATTN_V, "wo": MT.ATTN_OUT, "wq_a": MT.ATTN_Q_A,
         "wq_b": MT.ATTN_Q_B, "wkv_a": MT.ATTN_KV_A_MQA, "wg": MT.ATTN_GATE}
_SHARED = {"gate": MT.FFN_GATE_SHEXP, "up": MT.FFN_UP_SHEXP, "down": MT.FFN_DOWN_SHEXP}
_DENSE = {"gate": MT.FFN_GATE, "up": MT.FFN_UP, "down": MT.FFN_DOWN}
EXPERT_KINDS = {"gate": MT.FFN_GATE_EXP, "up": MT.FFN_UP_EXP, "down": MT.FFN_DOWN_EXP}


@dataclass
class Hessians:
    """Input statistics per matrix key: H = sum x^T x [K, K] (float64) and the rows seen; with
    `diag_only`, only its diagonal sum x^2 [K] (an importance matrix's `in_sum2`).

    A key is a tensor name, or (tensor name, expert) for a routed expert's slab."""
    diag_only: bool = False
    H: dict = field(default_factory=dict)
    n: dict = field(default_factory=dict)
    alias: dict = field(default_factory=dict)  # key -> key of the matrix that reads the same input
    _seen: list = field(default_factory=list)  # (input, key) of the current pass

    def record(self, key, x: torch.Tensor) -> None:
        if key in self.alias:
            return
        for y, other in self._seen:
            if y is x:
                if other != key:
                    self.alias[key] = other
                return
        x2 = x.reshape(-1, x.shape[-1]).double()
        self.H[key] = self.H.get(key, 0) + (x2.square().sum(0) if self.diag_only else x2.T @ x2)
        self.n[key] = self.n.get(key, 0) + x2.shape[0]
        self._seen.append((x, key))

    def end_pass(self) -> None:
        self._seen.clear()

    def get(self, key) -> tuple[torch.Tensor | None, int]:
        key = self.alias.get(key, key)
        return self.H.get(key), self.n.get(key, 0)


class Recorder:
    """A float weight [N, K] whose products record their inputs in `stats` under `key`."""

    def __init__(self, weight: torch.Tensor, key, stats: Hessians):
        self.weight, self.key, self.stats = weight, key, stats

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.stats.record(self.key, x)
        return F.linear(x, self.weight)


class LayerExperts(ExpertMemory):
    """One layer's routed experts in RAM (float, or `Recorder`s); counts routing per expert."""

    def __init__(self, layer: int, experts: list[ExpertWeights]):
        self.layer, self.experts = layer, experts
        self.device, self.dtype, self.max_acquire = torch.device("cpu"), torch.float32, max(1, len(experts))
        self.counts = np.zeros(len(experts), dtype=np.int64)

    def observe(self, layer: int, expert_ids: torch.Tensor) -> None:
        self.counts += np.bincount(expert_ids.flatten().numpy(), minlength=len(self.experts))

    def start(self, layer: int, expert_ids: Sequence[int]) -> list[ExpertWeights]:
        return [self.experts[e] for e in expert_ids]

    def release(self, layer: int, expert_ids: Sequence[int]) -> None:
        pass


class _DictWeights(WeightReader):
    """`WeightReader` over float32 arrays by GGUF name (no file): what the loader builds layers from."""

    def __init__(self, tensors: dict[str, np.ndarray], expert_layers: list[int], hp: HParams):
        self.tensors, self.compute, self.device, self.dtype = tensors, None, torch.device("cpu"), torch.float32
        self.impl = TORCH  # float torch layers: calibration records their inputs
        resident = {name: SimpleNamespace(ggml_type=GGMLType.F32, shape=tuple(a.shape))  # the layer specs read these
                    for name, a in tensors.items()}
        self.mf = SimpleNamespace(expert_layers=expert_layers, path="(calibration)", hparams=hp, resident=resident)

    def has(self, kind: MT, layer: int | None = None, suffix: str = "weight") -> bool:
        return weight_name(kind, layer, suffix) in self.tensors

    def get(self, kind: MT, layer: int | None, shape: tuple[int, ...], suffix: str = "weight") -> torch.Tensor:
        name = weight_name(kind, layer, suffix)
        a = self.tensors.get(name)
        if a is None or a.size != int(np.prod(shape)):
            raise ValueError(f"calibration: tensor {name}: expected shape {list(shape)}, "
                             f"found {None if a is None else list(a.shape)}")
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).reshape(shape)


class LayerRunner:
    """Runs layers of one model over hidden states [N, D] cut into sequences of `n_ctx` tokens."""

    def __init__(self, arch: Arch, hp: HParams, expert_layers: list[int], n_ctx: int):
        self.arch, self.hp, self.expert_layers, self.n_ctx = arch, hp, expert_layers, n_ctx
        self.rope = Rope(hp, torch.device("cpu"))
        heads, kdim, vdim = cache_dims(hp)
        self.kv = (torch.zeros((1, heads, n_ctx, kdim)), torch.zeros((1, heads, n_ctx, vdim)))
        self._batches: dict[int, Batch] = {}  # by the sequence's first row

    def build(self, layer: int, tensors: dict[str, np.ndarray], stats: Hessians | None):
        """Layer `layer` from float `tensors`; with `stats`, every matrix records its inputs.
        Returns (block, LayerExperts or None)."""
        memory = None
        if layer in self.expert_layers:
            memory = LayerExperts(layer, self._experts(layer, tensors, stats))
        block = layer_block(_DictWeights(tensors, self.expert_layers, self.hp), self.arch, self.hp, layer, self.rope,
                            memory)
        if stats is not None:
            self._wrap(block, layer, stats)
        return block, memory

    def _experts(self, layer: int, tensors: dict[str, np.ndarray], stats: Hessians | None) -> list[ExpertWeights]:
        parts = {p: torch.from_numpy(np.ascontiguousarray(tensors[weight_name(k, layer)], dtype=np.float32))
                 for p, k in EXPERT_KINDS.items()}  # [E, rows, cols] each
        out = []
        for e in range(parts["gate"].shape[0]):
            mats = {p: parts[p][e] if stats is None else Recorder(parts[p][e], (weight_name(k, layer), e), stats)
                    for p, k in EXPERT_KINDS.items()}
            out.append(ExpertWeights(**mats))
        return out

    @staticmethod
    def _wrap(block, layer: int, stats: Hessians) -> None:
        def wrap(owner, table):
            for attr, kind in table.items():
                w = getattr(owner, attr, None)
                if isinstance(w, torch.Tensor):
                    setattr(owner, attr, Recorder(w, weight_name(kind, layer), stats))

        wrap(block.attention.w, _ATTN)
        ffn = block.ffn
        if isinstance(ffn, MoE) and ffn.shared is not None:
            wrap(ffn.shared.ffn, _SHARED)
        elif isinstance(ffn, FeedForward):
            wrap(ffn, _DENSE)

    @torch.inference_mode()
    def run(self, block, hidden: torch.Tensor, stats: Hessians | None = None) -> torch.Tensor:
        """The block applied to every sequence of `hidden` [N, D]; returns the new hidden states."""
        out = torch.empty_like(hidden)
        for s in range(0, hidden.shape[0], self.n_ctx):
            x = hidden[s:s + self.n_ctx]
            # one cache block of n_ctx positions; a sequence's batch is the same from layer to layer, so
            # what a layer leaves in it (a sparse-attention layer's choice) reaches the next layers
            batch = self._batches.setdefault(s, Batch.make([[0]], [0], [x.shape[0]], self.n_ctx))
            cos_sin = self.rope.cos_sin(batch.positions, x.dtype)
            out[s:s + x.shape[0]] = block(x, batch, cos_sin, self.kv)
            if stats is not None:
                stats.end_pass()
        return out


__all__ = ["EXPERT_KINDS", "Hessians", "LayerExperts", "LayerRunner", "Recorder"]
