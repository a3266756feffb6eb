"""DeepSeek Sparse Attention (DeepSeek-V3.2 `deepseek32`, GLM-5 `glm-dsa`): latent attention
(strata.models.mla, whose maths this reuses) over the past positions a lightning indexer picks
for each query. Per token, as llama.cpp's deepseek32 / glm-dsa graphs compute it:

    qi = rope(q_b @ q_low).view(Hi, Di)            # q_low: the query LoRA's normed latent [Q]
    ki = rope(layernorm(k @ x))                    # [Di]: one indexer key per position
    qi, ki = qi @ Hd, ki @ Hd                      # Hd: the orthonormal Walsh-Hadamard matrix of Di
    wt = (proj @ x) / sqrt(Di * Hi)                # [Hi]
    score[s] = sum_h wt[h] * relu(qi[h] . ki_s)    # every position s <= the token's own
    keep = top_k(score)                            # the latent attention sees only these positions

RoPE turns the first rope_dim features of each indexer head ([rope | nope]): NEOX for deepseek32,
NORM for glm-dsa (`Arch.indexer_rope`). The keys are cached beside the latent, in the value slot
of the layer's KV cache (latent attention leaves it empty: `loader.cache_dims`), rounded to f16
before they are stored, as llama.cpp's indexer cache (the K cache type, f16 by default) holds
them. Where every position a token sees fits in top_k, all are kept and the scores are not needed
(the keys are still written). GLM-5's shared layers (`attention.indexer.types` false) run no
indexer and keep what the full layer before them kept, within the same pass (`Batch.scratch`).

transformers computes the same selection without the rotation (orthogonal: the same scores in
exact arithmetic) from float32 keys, scaling the scores by Di^-0.5 before the ReLU and the
weights by Hi^-0.5 (the same product); the two choose differently only where two scores lie
within the f16 rounding of a key, and files follow llama.cpp.
Dimension letters as strata.models.mla's, and Hi indexer heads, Di their width, K top_k.
Must not: allocate the cache or read files.
"""
from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gguf.constants import MODEL_TENSOR as MT

from .attention import query_pieces
from .batch import Batch
from .kinds import implements, reader
from .layers import Weight, linear
from .mla import MLAttention, mla_options, read_mla_weights
from .rope import Rope
from .spec import DSA

#: Where a full layer leaves its choice for the shared layers after it (`Batch.scratch`).
KEPT = "dsa.keep"


@dataclass
class IndexerWeights:
    q_b: Weight  # [Hi*Di, Q]
    k: Weight  # [Di, D]
    k_norm: torch.Tensor  # [Di] LayerNorm weight
    k_norm_b: torch.Tensor  # [Di] LayerNorm bias
    proj: torch.Tensor  # [Hi, D], float (F32 in llama.cpp's files, as routers)


@functools.cache
def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Walsh-Hadamard matrix [n, n] (Sylvester's order, n a power of two), float32:
    the one llama.cpp turns indexer queries and keys with. Symmetric, its own inverse."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)))
    return (h / math.sqrt(n)).float()


@implements(DSA, "torch")
class DSAttention(MLAttention):
    """Sparse latent attention (see the module docstring), the torch reference (the native
    executor: strata.models.executor.dsa). idx: the layer's indexer, None on a shared layer."""

    def __init__(self, w, *dims, idx: IndexerWeights | None, n_index_head: int, top_k: int, index_rope: Rope,
                 norm_eps: float, **options):
        super().__init__(w, *dims, **options)
        self.idx, self.n_index_head, self.top_k = idx, n_index_head, top_k
        self.index_rope, self.norm_eps = index_rope, norm_eps

    def forward(self, x: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
                kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q_low = self.query_latent(x)  # [T, Q]
        if self.idx is not None:
            batch.scratch[KEPT] = self.select(x, q_low, batch, cos_sin, kv[1])
        elif KEPT not in batch.scratch:
            raise RuntimeError(f"layer {self.layer}: a shared indexer layer ran before any full one in this pass")
        return self.latent(x, q_low, batch, cos_sin, kv[0], batch.scratch[KEPT])  # [T, D]

    def select(self, x: torch.Tensor, q_low: torch.Tensor, batch: Batch, cos_sin: tuple[torch.Tensor, torch.Tensor],
               keys: torch.Tensor) -> torch.Tensor | None:
        """Write the new tokens' indexer keys into `keys` [N, 1, P, Di]; the positions each token
        keeps, keep [T, K] (each sequence's own positions), or None where every token keeps all."""
        idx, T = self.idx, x.shape[0]
        Hd = hadamard(idx.k_norm.shape[0]).to(x.device)
        k = F.layer_norm(linear(x, idx.k).float(), idx.k_norm.shape, idx.k_norm.float(), idx.k_norm_b.float(),
                         self.norm_eps)  # [T, Di]
        k = self.index_rope.apply(k[:, None], *cos_sin)[:, 0] @ Hd
        batch.write(keys, k.half()[:, None])  # f16: llama.cpp's indexer cache
        if batch.upto <= self.top_k:
            return None
        q = self.index_rope.apply(linear(q_low, idx.q_b).float().view(T, self.n_index_head, -1), *cos_sin) @ Hd
        wt = linear(x, idx.proj).float() / math.sqrt(q.shape[-1] * self.n_index_head)  # [T, Hi]
        keep = []
        for b, (start, n, off) in enumerate(zip(batch.starts, batch.lengths, batch.offsets)):
            seen = start + n
            if seen <= self.top_k:  # every position fits: all kept (indices past `seen` would not scatter)
                keep.append(torch.arange(self.top_k, device=x.device).clamp(max=seen - 1).expand(n, -1))
                continue
            ks = batch.read(keys, b, torch.float32)[0]  # [seen, Di]
            # long steps go in pieces of queries (the scores of a piece stay within SCORE_ELEMENTS)
            keep += [top_positions(q[off + i:off + j], wt[off + i:off + j], ks, start + i, self.top_k)
                     for i, j in query_pieces(start, n, self.n_index_head)]
        return torch.cat(keep)


def top_positions(q: torch.Tensor, wt: torch.Tensor, keys: torch.Tensor, start: int, k: int) -> torch.Tensor:
    """The k best positions [n, k] for queries q [n, Hi, Di] (at positions start..start+n-1) with
    head weights wt [n, Hi] over keys [>= k, Di]; a token's later positions score -inf (a token
    that sees fewer than k positions keeps them all, and masked ones its attention drops; keys
    past the last query's position are not scored)."""
    n = q.shape[0]
    keys = keys[:max(start + n, k)]  # [seen, Di]: a token sees up to its own position (k at least, for topk)
    scores = torch.relu(torch.einsum("thd,sd->ths", q, keys))  # [n, Hi, seen]
    scores = torch.einsum("ths,th->ts", scores, wt)  # [n, seen]
    later = torch.arange(keys.shape[0], device=q.device)[None, :] > torch.arange(start, start + n, device=q.device)[:, None]
    return scores.masked_fill_(later, float("-inf")).topk(k, dim=-1).indices


@reader(DSA)
def read_dsa(cls, w, arch, hp, spec, rope: Rope) -> DSAttention:
    """Layer spec.index's sparse latent attention as `cls`: latent attention's weights and, on a
    layer that runs its own indexer, the indexer's."""
    weights, dims = read_mla_weights(w, hp, spec)
    D, i, ix = hp.n_embd, spec.index, hp.indexer
    idx = None
    if not spec.attention.index_shared:
        idx = IndexerWeights(q_b=w.matrix(MT.INDEXER_ATTN_Q_B, i, (ix.n_head * ix.head_dim, hp.q_lora_rank)),
                             k=w.matrix(MT.INDEXER_ATTN_K, i, (ix.head_dim, D)),
                             k_norm=w.get(MT.INDEXER_K_NORM, i, (ix.head_dim,)),
                             k_norm_b=w.get(MT.INDEXER_K_NORM, i, (ix.head_dim,), "bias"),
                             proj=w.get(MT.INDEXER_PROJ, i, (ix.n_head, D)))  # float, as routers
    index_rope = copy.copy(rope)  # the same tables, the indexer's own arrangement
    index_rope.neox = arch.indexer_rope == "neox"
    return cls(weights, *dims, rope=rope, idx=idx, n_index_head=ix.n_head, top_k=ix.top_k, index_rope=index_rope,
               norm_eps=arch.indexer_norm_eps, **mla_options(hp, spec))


__all__ = ["DSAttention", "IndexerWeights", "KEPT", "hadamard", "read_dsa", "top_positions"]
