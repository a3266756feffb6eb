"""The decoder: embedding, blocks of (attention, FFN) with pre-norm residuals, norm, output head.

Dimension letters: T new tokens in the batch (all sequences), B sequences, D = n_embd,
H / Hkv query / key-value heads, hd head dim, E experts, K experts per token, V vocabulary.
Must not: read files or reach expert bytes (the expert memory does).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from .batch import Batch, KVStore
from .layers import FeedForward, RMSNorm, Weight, embed, linear
from .moe import Lookahead, MoE
from .nextn import NextnLayers
from .rope import Rope
from .spec import LayerSpec


@dataclass
class StepTimes:
    """Where forward passes spent their time (seconds, summed since the last `reset`): the whole
    pass, attention, and routed experts (waits for the expert memory included; the memory's own
    statistics split those out). `tokens` counts the tokens the passes processed."""

    total_s: float = 0.0
    attention_s: float = 0.0
    experts_s: float = 0.0
    tokens: int = 0

    def reset(self) -> None:
        self.total_s = self.attention_s = self.experts_s = 0.0
        self.tokens = 0


class Block(nn.Module):
    def __init__(self, attention_norm: RMSNorm, attention: nn.Module, ffn_norm: RMSNorm, ffn: MoE | FeedForward,
                 lookahead: Lookahead | None = None):
        super().__init__()
        self.attention_norm, self.attention, self.ffn_norm, self.ffn = attention_norm, attention, ffn_norm, ffn
        self.lookahead = lookahead  # announces the next MoE layers' experts when the expert memory prefetches
        self.clock = [0.0]  # time in attention since the last reset (a list: see RoutedExperts._seconds)

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        t0 = time.perf_counter()
        h = x + self.attention(self.attention_norm(x), batch, cos_sin, kv)  # [T, D]
        self.clock[0] += time.perf_counter() - t0
        if self.lookahead is not None:
            self.lookahead(h)  # next layers' experts start moving; h is unchanged
        return h + self.ffn(self.ffn_norm(h))  # [T, D]


class Transformer(nn.Module):
    """A decoder-only MoE transformer built by `strata.models.load_model`: the maths of every step.
    A runner (`strata.runtime`) may pass `layers`, a faster form of the blocks' loop, to `forward`."""

    def __init__(self, embedding: Weight, blocks: list[Block], norm: RMSNorm, output: Weight, rope: Rope,
                 specs: list[LayerSpec], compute=None, lookahead: Lookahead | None = None,
                 nextn: NextnLayers | None = None):
        super().__init__()
        self.embedding, self.blocks, self.norm, self.output, self.rope = embedding, blocks, norm, output, rope
        self.specs = specs  # the LayerSpec of each block (strata.models.spec): what the runtime plans from
        self.lookahead = lookahead  # announces the first MoE layers' experts from the embeddings
        self.compute = compute  # PackedCompute of packed compute (its pool and scratch), or None (float)
        self.nextn = nextn or NextnLayers()  # the file's multi-token-prediction blocks: kept, not run
        self._total_s, self._tokens = 0.0, 0

    @property
    def vocab_size(self) -> int:
        return self.output.shape[0]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, batch: Batch, cache: KVStore, all_logits: bool = False,
                layers=None) -> torch.Tensor:
        """Logits [T, V] of every new token (`all_logits`), else [B, V] of each sequence's last one.

        Writes the new tokens' keys and values into `cache`'s blocks as `batch`'s block tables say.
        layers: None (the blocks one by one, `run_blocks`) or a callable of the same signature that
        computes the same maths (a runner's fused decode step or decode program).
        """
        t0 = time.perf_counter()
        x = embed(self.embedding, tokens)  # [T, D]
        if self.lookahead is not None:
            self.lookahead(x)
        cos_sin = self.rope.cos_sin(batch.positions, x.dtype, batch.upto)  # [T, R/2] each
        x = (layers or self.run_blocks)(x, batch, cos_sin, cache)  # [T, D]
        if not all_logits:
            x = x[batch.last]  # [B, D]
        logits = linear(self.norm(x), self.output).float()  # [T or B, V]
        self._total_s += time.perf_counter() - t0
        self._tokens += int(tokens.numel())
        return logits

    def run_blocks(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor], cache: KVStore,
                   steps: list | None = None) -> torch.Tensor:
        """x [T, D] through every block; steps[i], where given and not None, computes block i's
        maths in its place (a fused decode step)."""
        tables = {id(self.rope): cos_sin}  # sliding-window layers may have their own base
        for i, block in enumerate(self.blocks):
            rope = block.attention.rope
            if id(rope) not in tables:
                tables[id(rope)] = rope.cos_sin(batch.positions, x.dtype, batch.upto)
            step = block if steps is None or steps[i] is None else steps[i]
            x = step(x, batch, tables[id(rope)], cache.layer(i))  # [T, D]
        return x

    def times(self) -> StepTimes:
        """The time split of the passes since the last `reset_times` (a runner adds what its
        decode program measured)."""
        experts = sum(b.ffn.experts.seconds for b, s in zip(self.blocks, self.specs) if s.ffn.moe)
        attention = sum(b.clock[0] for b in self.blocks)
        return StepTimes(self._total_s, attention, experts, self._tokens)

    def reset_times(self) -> None:
        self._total_s, self._tokens = 0.0, 0
        for b, s in zip(self.blocks, self.specs):
            b.clock[0] = 0.0
            if s.ffn.moe:
                b.ffn.experts.seconds = 0.0


__all__ = ["Block", "StepTimes", "Transformer"]
