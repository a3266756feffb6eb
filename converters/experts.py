"""Where a checkpoint's routed experts come from, in either of the layouts HF checkpoints use.

Per-expert: `model.layers.N.{mlp|block_sparse_moe}.experts.E.{w1,w3,w2 | gate,up,down_proj}`,
one 2-D tensor per expert and part; fused (transformers 5 in memory): `experts.gate_up_proj`
[E, 2I, H] (gate rows first) and `experts.down_proj` [E, H, I]. A source reads one expert's part
at a time as float32, so a layer's experts never sit in memory together. No GGUF names here.
"""
from __future__ import annotations

import re

import numpy as np

from converters.source import Checkpoint, SourceTensor

_PART_OF = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}
_PER_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                         r"(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.experts\.(gate_up_proj|down_proj)(?:\.weight)?$")


def match_per_expert(name: str) -> tuple[int, int, str] | None:
    """(layer, expert, 'gate' | 'up' | 'down') of a per-expert HF tensor name, else None."""
    m = _PER_EXPERT.match(name)
    return (int(m[1]), int(m[2]), _PART_OF[m[3]]) if m else None


def match_fused(name: str) -> tuple[int, str] | None:
    """(layer, 'gate_up_proj' | 'down_proj') of a fused HF expert tensor name, else None."""
    m = _FUSED.match(name)
    return (int(m[1]), m[2]) if m else None


class ExpertSource:
    """Where the routed experts of one layer come from: `read(part, e)` -> float32 [rows, cols]."""

    def read(self, part: str, e: int) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self, part: str) -> int:
        raise NotImplementedError

    def names(self, part: str) -> tuple[str, ...]:
        raise NotImplementedError


class PerExpertSource(ExpertSource):
    """`experts.N.{w1,w3,w2}` or `experts.N.{gate,up,down}_proj`: one 2-D tensor per expert and part."""

    def __init__(self, ckpt: Checkpoint, srcs: dict[tuple[str, int], SourceTensor], n_experts: int):
        self.ckpt, self.srcs, self.n = ckpt, srcs, n_experts

    def read(self, part: str, e: int) -> np.ndarray:
        return self.ckpt.read_rows(self.srcs[(part, e)].name)

    def nbytes(self, part: str) -> int:
        return sum(self.srcs[(part, e)].nbytes for e in range(self.n))

    def names(self, part: str) -> tuple[str, ...]:
        return tuple(self.srcs[(part, e)].name for e in range(self.n))


class _GateUpDownSource(ExpertSource):
    """A fused `gate_up` tensor (both halves of each expert's gate and up) and a `down` tensor."""

    def __init__(self, ckpt: Checkpoint, gate_up: SourceTensor, down: SourceTensor, n_ff: int, n_embd: int):
        self.ckpt, self.gate_up, self.down, self.n_ff, self.n_embd = ckpt, gate_up, down, n_ff, n_embd

    def nbytes(self, part: str) -> int:
        return self.down.nbytes if part == "down" else self.gate_up.nbytes // 2

    def names(self, part: str) -> tuple[str, ...]:
        return ((self.down if part == "down" else self.gate_up).name,)


class FusedSource(_GateUpDownSource):
    """transformers' fused layout: `gate_up_proj` [E, 2I, H] (gate rows first) and `down_proj` [E, H, I]."""

    def read(self, part: str, e: int) -> np.ndarray:
        if part == "down":
            return self.ckpt.read_slab(self.down.name, e, (self.n_embd, self.n_ff))
        # Expert e's [2I, H] block is two [I, H] slabs: 2e (gate) and 2e + 1 (up).
        return self.ckpt.read_slab(self.gate_up.name, 2 * e + (part == "up"), (self.n_ff, self.n_embd))


class TransposedSource(_GateUpDownSource):
    """Fused and transposed (Llama 4, gpt-oss): `gate_up` [E, H, 2I], `down` [E, I, H]; the gate and
    up columns are two halves (gate first) or, `interleaved`, alternate (gate = [..., ::2])."""

    def __init__(self, ckpt: Checkpoint, gate_up: SourceTensor, down: SourceTensor, n_ff: int, n_embd: int,
                 interleaved: bool = False):
        super().__init__(ckpt, gate_up, down, n_ff, n_embd)
        self.interleaved = interleaved

    def read(self, part: str, e: int) -> np.ndarray:
        if part == "down":
            return np.ascontiguousarray(self.ckpt.read_slab(self.down.name, e, (self.n_ff, self.n_embd)).T)  # [H, I]
        slab = self.ckpt.read_slab(self.gate_up.name, e, (self.n_embd, 2 * self.n_ff))  # [H, 2I]
        up = part == "up"
        cols = slice(int(up), None, 2) if self.interleaved else slice(up * self.n_ff, (1 + up) * self.n_ff)
        return np.ascontiguousarray(slab[:, cols].T)  # [I, H]
