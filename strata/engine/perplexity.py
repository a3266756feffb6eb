"""Perplexity as llama.cpp's `llama-perplexity` computes it, and logits comparisons (KL, top-1).

The text's tokens are cut into chunks of n_ctx; each chunk is evaluated as a fresh sequence
(its first token replaced by BOS when the tokenizer adds one) and only the second half of each
chunk is scored: positions j in [n_ctx/2, n_ctx - 1) predict token j + 1, so every scored token
has at least n_ctx/2 tokens of context. PPL = exp(mean negative log-likelihood).

Must not read files or print: token ids and a logits function in, numbers out.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from strata.errors import StrataError


@dataclass
class PerplexityResult:
    ppl: float
    nll: float  # mean negative log-likelihood per scored token
    n_scored: int
    n_ctx: int
    chunk_ppl: list[float] = field(default_factory=list)
    logits: torch.Tensor | None = None  # [N, V] float32 at the scored positions, when kept
    targets: list[int] = field(default_factory=list)  # [N] the tokens those positions predict
    ppl_stderr: float | None = None  # standard error of ppl (None with one scored token)

    def to_dict(self) -> dict:
        return {"ppl": self.ppl, "ppl_stderr": self.ppl_stderr, "nll": self.nll, "n_scored": self.n_scored,
                "n_ctx": self.n_ctx, "n_chunks": len(self.chunk_ppl), "chunk_ppl": self.chunk_ppl}


@dataclass(frozen=True)
class ChunkDone:
    """Progress after a chunk: `chunk` of `n_chunks` (from 1), the PPL of the chunks so far, and
    the seconds since the first chunk began."""

    chunk: int
    n_chunks: int
    ppl: float
    seconds: float


def ppl_stderr(nll_sum: float, nll2_sum: float, n: int) -> float | None:
    """Standard error of exp(mean NLL) from the sums of NLL and NLL^2 over n scored tokens
    (llama.cpp's estimate: exp(mean) x sqrt(var / (n - 1)))."""
    if n < 2:
        return None
    mean = nll_sum / n
    var = max(nll2_sum / n - mean * mean, 0.0)
    return math.exp(mean) * math.sqrt(var / (n - 1))


def perplexity(logits_fn: Callable[[list[int]], torch.Tensor], tokens: list[int], n_ctx: int, bos: int | None,
               keep_logits: bool = False, on_chunk: Callable[[ChunkDone], None] | None = None) -> PerplexityResult:
    """PPL of `tokens` with `logits_fn(ids) -> [T, V]` evaluating one fresh sequence; `on_chunk`
    is called after each chunk."""
    if n_ctx < 4:
        raise StrataError(f"perplexity: n_ctx must be at least 4, found {n_ctx}")
    n_chunks = len(tokens) // n_ctx
    if n_chunks == 0:
        raise StrataError(f"perplexity: the text has {len(tokens)} tokens, fewer than one chunk of n_ctx={n_ctx}")
    first = n_ctx // 2
    total_nll, total_nll2, kept, targets, chunk_ppl = 0.0, 0.0, [], [], []
    t0 = time.perf_counter()
    for c in range(n_chunks):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        if bos is not None:
            chunk = [bos, *chunk[1:]]
        logits = logits_fn(chunk)[first:n_ctx - 1].float()  # [n_ctx/2 - 1, V]
        target = torch.tensor(tokens[c * n_ctx + first + 1:(c + 1) * n_ctx])  # [n_ctx/2 - 1]
        nll = -logits.log_softmax(-1).gather(1, target[:, None])[:, 0].double()
        total_nll += float(nll.sum())
        total_nll2 += float((nll * nll).sum())
        chunk_ppl.append(math.exp(float(nll.mean())))
        targets.extend(target.tolist())
        if keep_logits:
            kept.append(logits)
        if on_chunk is not None:
            on_chunk(ChunkDone(c + 1, n_chunks, math.exp(total_nll / len(targets)), time.perf_counter() - t0))
    n = len(targets)
    return PerplexityResult(math.exp(total_nll / n), total_nll / n, n, n_ctx, chunk_ppl,
                            torch.cat(kept) if keep_logits else None, targets, ppl_stderr(total_nll, total_nll2, n))


@dataclass
class LogitsComparison:
    kl_mean: float  # mean over positions of KL(base || other), nats
    kl_max: float
    top1_agreement: float  # fraction of positions whose argmax agrees
    n: int

    def to_dict(self) -> dict:
        return {"kl_mean": self.kl_mean, "kl_max": self.kl_max, "top1_agreement": self.top1_agreement, "n": self.n}


def compare_logits(base: torch.Tensor, other: torch.Tensor) -> LogitsComparison:
    """KL divergence of `other`'s distribution from `base`'s, and top-1 agreement; both [N, V]."""
    if base.shape != other.shape:
        raise StrataError(f"logits to compare differ in shape: base {list(base.shape)}, this {list(other.shape)}")
    p_log, q_log = base.double().log_softmax(-1), other.double().log_softmax(-1)
    kl = (p_log.exp() * (p_log - q_log)).sum(-1)  # [N]
    agree = (base.argmax(-1) == other.argmax(-1)).double().mean()
    return LogitsComparison(float(kl.mean()), float(kl.max()), float(agree), base.shape[0])


__all__ = ["ChunkDone", "LogitsComparison", "PerplexityResult", "compare_logits", "perplexity", "ppl_stderr"]
