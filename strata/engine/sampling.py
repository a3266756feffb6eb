"""Choosing the next token from logits: greedy, or sampling with the usual filters.

Order of operations (transformers' order): repetition penalty over every token already in the
sequence (prompt and output; CTRL's rule: positive logits divided by the penalty, negative ones
multiplied), temperature, top-k, top-p (smallest set whose probability reaches p), min-p (drop
tokens below min_p x the top probability), then a draw from the renormalised distribution.
Temperature 0 is greedy (argmax after the penalty). Each sequence draws from its own generator,
seeded from `seed`, so a seeded result does not depend on what else runs in the batch.

Must not touch the model or the KV cache: logits and a token history in, one token id out.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

import torch

from strata.errors import StrataArgumentError, StrataError

#: Largest seed a torch generator takes (seeds are unsigned 64-bit).
MAX_SEED = 2**64 - 1


def _range(low: float | None, high: float | None, low_open: bool) -> str:
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"<= {high:g}"
    return " and ".join(x for x in (lo, hi) if x)


def check_number(name: str, value, low: float | None, high: float | None, low_open: bool = False) -> float:
    """`value` as a float when it is a finite number in the range; else StrataArgumentError naming `name`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        raise StrataArgumentError(f"{name}: expected a finite number {_range(low, high, low_open)}, found {value!r}")
    return float(value)


def check_int(name: str, value, low: int | None, high: int | None) -> int:
    """`value` when it is an integer in [low, high]; else StrataArgumentError naming `name`."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not (ok and (low is None or value >= low) and (high is None or value <= high)):
        raise StrataArgumentError(f"{name}: expected an integer {_range(low, high, False)}, found {value!r}")
    return value


#: The sampling options' ranges: (kind, low, high, low excluded), by SamplingParams field name.
SAMPLING_RANGES = {"temperature": ("number", 0.0, None, False), "top_k": ("int", 0, None, False),
                   "top_p": ("number", 0.0, 1.0, True), "min_p": ("number", 0.0, 1.0, False),
                   "repetition_penalty": ("number", 0.0, None, True), "seed": ("int", 0, MAX_SEED, False)}


def check_sampling(values: dict, names: dict[str, str] | None = None) -> None:
    """Check each sampling option of `values` (SamplingParams field name -> value; a seed of None
    is a fresh one) against SAMPLING_RANGES; errors name the option as `names` spells it (a
    command-line flag), else by its field name."""
    for field, (kind, low, high, low_open) in SAMPLING_RANGES.items():
        value, name = values[field], (names or {}).get(field, field)
        if field == "seed" and value is None:
            continue
        if kind == "int":
            check_int(name, value, low, high)
        else:
            check_number(name, value, low, high, low_open=low_open)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None  # None: a fresh random seed per sequence

    def __post_init__(self):
        check_sampling(self.__dict__)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    if penalty == 1.0 or not history:
        return logits
    ids = torch.tensor(sorted(set(history)), device=logits.device)
    picked = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def filter_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits [V] with the tokens top-k / top-p / min-p drop set to -inf."""
    logits = logits / p.temperature
    if p.top_k and p.top_k < logits.shape[-1]:
        kth = logits.topk(p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= p.top_p  # tokens after the set has reached top_p
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    """The next-token rule of one sequence."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = torch.Generator()
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        """Next token id from logits [V] (float32) given the tokens so far."""
        if torch.isnan(logits).any():
            raise StrataError("sampling: the model's logits contain NaN (corrupt weights or hyperparameters?)")
        logits = apply_repetition_penalty(logits, history, self.params.repetition_penalty)
        if self.params.greedy:
            return int(logits.argmax())
        probs = filter_logits(logits, self.params).softmax(-1).cpu()
        if not torch.isfinite(probs).all():  # an infinite logit
            raise StrataError("sampling: the model's logits are not finite (corrupt weights or hyperparameters?)")
        return int(torch.multinomial(probs, 1, generator=self.generator))


__all__ = ["MAX_SEED", "SAMPLING_RANGES", "Sampler", "SamplingParams", "check_int", "check_number", "check_sampling", "apply_repetition_penalty", "filter_logits"]
