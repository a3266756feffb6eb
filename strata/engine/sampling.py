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

import os
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

import torch

from strata.defaults import SAMPLING_DEFAULTS
from strata.errors import StrataError

from .config import Names, OptionError, check_int, check_number, spell

#: Largest seed a torch generator takes (seeds are unsigned 64-bit).
MAX_SEED = 2**64 - 1

#: The sampler's options' ranges: (kind, low, high, low excluded), by SamplingParams field name.
SAMPLING_RANGES = {"temperature": ("number", 0.0, None, False), "top_k": ("int", 0, None, False),
                   "top_p": ("number", 0.0, 1.0, True), "min_p": ("number", 0.0, 1.0, False),
                   "repetition_penalty": ("number", 0.0, None, True), "seed": ("int", 0, MAX_SEED, False)}


def check_sampling(values: Mapping[str, Any], names: Names | None = None) -> dict[str, Any]:
    """SamplingParams' fields checked and normalised (stop as a tuple, stop_token_ids as a
    frozenset); errors name each option as `names` spells it (a command-line flag), else by its
    field name. A seed of None is a fresh one; max_tokens None runs until the context is full;
    stop_token_ids None means the model's end-of-generation tokens."""
    out = dict(values)
    for f, (kind, low, high, low_open) in SAMPLING_RANGES.items():
        value = out.get(f)
        if f == "seed" and value is None:
            continue
        if kind == "int":
            check_int(spell(f, names), value, low, high, f)
        else:
            check_number(spell(f, names), value, low, high, low_open=low_open, field=f)
    if out.get("max_tokens") is not None:
        check_int(spell("max_tokens", names), out["max_tokens"], 1, None, "max_tokens")
    out["stop"] = _stop_strings(out.get("stop"), spell("stop", names))
    ids = out.get("stop_token_ids")
    if ids is not None:
        out["stop_token_ids"] = _token_ids(ids, spell("stop_token_ids", names))
    return out


def _stop_strings(stop: str | Iterable[str] | None, name: str) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else stop
    if stops is None:
        return ()
    if not isinstance(stops, tuple) or not all(isinstance(s, str) and s for s in stops):
        raise OptionError("stop", f"{name}: expected a non-empty string or a list of them, found {stop!r:.80}")
    return stops


def _token_ids(ids: Iterable[int], name: str) -> frozenset[int]:
    try:
        out = frozenset(ids)
    except TypeError:
        out = None
    if out is None or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in out):
        raise OptionError("stop_token_ids", f"{name}: expected token ids (integers >= 0), found {ids!r:.80}")
    return out


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens and when it stops (vLLM's name and fields).

    The defaults are strata.defaults.SAMPLING_DEFAULTS, the rule `generate`, `chat` and `serve`
    follow too (temperature 0.8, top_k 40, other filters off, 256 tokens): the API samples, as
    llama-cpp-python's Llama does. `temperature=0` is greedy; a `seed` makes sampling reproducible.
    """

    temperature: float = SAMPLING_DEFAULTS["temperature"]  # 0: greedy
    top_k: int = SAMPLING_DEFAULTS["top_k"]  # 0: off
    top_p: float = SAMPLING_DEFAULTS["top_p"]  # 1: off
    min_p: float = SAMPLING_DEFAULTS["min_p"]  # 0: off
    repetition_penalty: float = SAMPLING_DEFAULTS["repetition_penalty"]  # 1: off
    seed: int | None = None  # None: a fresh random seed per sequence
    max_tokens: int | None = SAMPLING_DEFAULTS["max_tokens"]  # at most; None: until the context is full
    stop: tuple[str, ...] = ()  # stop strings (a single string is one): end the text, not part of it
    stop_token_ids: frozenset[int] | None = None  # None: the model's end-of-generation tokens

    def __post_init__(self):
        for f, v in check_sampling(self.__dict__).items():
            object.__setattr__(self, f, v)

    @classmethod
    def build(cls, names: Names | None = None, **options: Any) -> SamplingParams:
        """The params of these options, errors naming them as `names` spells them (CLI flags)."""
        unknown = sorted(set(options) - set(FIELDS))
        if unknown:
            raise OptionError(unknown[0], f"{unknown[0]}: not a sampling option (expected one of {', '.join(FIELDS)})")
        return cls(**check_sampling({**DEFAULTS, **options}, names))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


#: SamplingParams' field names: the keyword options `generate` takes as sugar for one.
FIELDS = tuple(f.name for f in fields(SamplingParams))
DEFAULTS = {f.name: f.default for f in fields(SamplingParams)}


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


__all__ = ["DEFAULTS", "FIELDS", "MAX_SEED", "SAMPLING_RANGES", "Sampler", "SamplingParams", "apply_repetition_penalty",
           "check_int", "check_number", "check_sampling", "filter_logits"]
