"""Build a Strata model straight from a GGUF file (no engine) for model-level tests."""
from __future__ import annotations

import torch

from strata.engine.kv_cache import KVCache
from strata.gguf import open_model
from strata.memory import DirectExpertMemory
from strata.models import cache_dims, load_model

#: Acceptance bound: max |strata - transformers| <= REL_TOL * max |transformers logit|.
REL_TOL = 1e-4


class Bare:
    """A loaded model with a paged KV cache of `n_slots` sequences (slots 0..n_slots-1, all
    allocated), stepping sequences by hand."""

    def __init__(self, path, n_ctx: int = 128, n_slots: int = 1, max_acquire: int | None = None):
        self.mf = open_model(path)
        hp = self.mf.hparams
        self.memory = DirectExpertMemory(self.mf, max_acquire=max_acquire)
        self.model = load_model(self.mf, self.memory)
        self.cache = KVCache(hp.n_layers, n_slots, n_ctx, *cache_dims(hp))
        self.slots = [self.cache.allocate() for _ in range(n_slots)]

    def forward(self, ids: list[int], start: int, slot: int = 0, all_logits: bool = True) -> torch.Tensor:
        return self.model(torch.tensor(ids), self.cache.batch([slot], [start], [len(ids)]), self.cache, all_logits)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        logits = self.forward(prompt, 0, all_logits=False)[0]
        out = []
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = self.forward(out[-1:], len(prompt) + len(out) - 1)[0]
        return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max())
