"""Choosing the next token from logits: greedy, or sampling with the usual filters; and the
log-probabilities a request asked for.

Order of operations, per row of a batch:
1. repetition penalty over every token already in the sequence (prompt and output; CTRL's rule:
   positive logits divided by the penalty, negative ones multiplied);
2. OpenAI's additive penalties over the generated tokens only:
   `logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0)`;
3. logit_bias added to its tokens (-100 bans a token, +100 all but forces it);
4. temperature; then top-k, top-p (smallest set whose probability reaches p), min-p (drop tokens
   below min_p x the top probability), and a draw from the renormalised distribution.
Temperature 0 is greedy (argmax after steps 1-3). Steps 1-3 run vectorised over the batch.

Log-probabilities (`logprobs`): the log-softmax of the processed logits after steps 1-3 and the
temperature (a greedy row: temperature 1), before the top-k / top-p / min-p truncation, which
would give every alternative -inf. This is what vLLM reports as processed logprobs and what
OpenAI documents as the likelihood of each token given the request's sampling settings. They are
computed only for the rows that asked.

Each sequence draws from its own generator, seeded from `seed`, so a seeded result does not
depend on what else runs in the batch. Must not touch the model or the KV cache: logits and
token histories in, token ids (and their log-probabilities) out.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, Sequence

import torch

from strata.defaults import SAMPLING_DEFAULTS
from strata.errors import StrataError

from .config import Names, OptionError, check_int, check_number, spell
from .grammar import Grammar, Matcher, Vocabulary, apply_masks

#: Largest seed a torch generator takes (seeds are unsigned 64-bit).
MAX_SEED = 2**64 - 1
#: Alternatives per token that `logprobs` may ask for (OpenAI's top_logprobs limit).
MAX_LOGPROBS = 20
#: Choices per request at most (`n`).
MAX_N = 16
#: logit_bias values' range (OpenAI's).
MAX_BIAS = 100.0

#: The sampler's options' ranges: (kind, low, high, low excluded), by SamplingParams field name.
SAMPLING_RANGES = {"temperature": ("number", 0.0, None, False), "top_k": ("int", 0, None, False),
                   "top_p": ("number", 0.0, 1.0, True), "min_p": ("number", 0.0, 1.0, False),
                   "repetition_penalty": ("number", 0.0, None, True), "seed": ("int", 0, MAX_SEED, False),
                   "frequency_penalty": ("number", -2.0, 2.0, False), "presence_penalty": ("number", -2.0, 2.0, False),
                   "n": ("int", 1, MAX_N, False), "logprobs": ("int", 0, MAX_LOGPROBS, False)}
#: Options that may be None (None: a fresh seed; no log-probabilities).
OPTIONAL = ("seed", "logprobs")


def check_sampling(values: Mapping[str, Any], names: Names | None = None) -> dict[str, Any]:
    """SamplingParams' fields checked and normalised (stop as a tuple, stop_token_ids as a
    frozenset, logit_bias as sorted (id, bias) pairs); errors name each option as `names` spells
    it (a command-line flag), else by its field name. A seed of None is a fresh one; max_tokens
    None runs until the context is full; stop_token_ids None means the model's end-of-generation
    tokens; logprobs None asks for none, k for the sampled token's and the k likeliest."""
    out = dict(values)
    for f, (kind, low, high, low_open) in SAMPLING_RANGES.items():
        value = out.get(f)
        if f in OPTIONAL and value is None:
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
    out["logit_bias"] = _logit_bias(out.get("logit_bias"), spell("logit_bias", names))
    out["grammar"] = _grammar(out.get("grammar"), spell("grammar", names))
    return out


def _grammar(value: Any, name: str) -> Grammar | None:
    """None, a Grammar, GBNF text, or an OpenAI response_format object, as a Grammar (None for text)."""
    if value is None or isinstance(value, Grammar):
        return value
    if isinstance(value, str):
        return Grammar("gbnf", value, field=name)
    if isinstance(value, Mapping):
        return Grammar.from_response_format(value, name)
    raise OptionError("grammar", f"{name}: expected a Grammar, GBNF text or a response_format object, "
                                 f"found {value!r:.80}")


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


def _logit_bias(bias: Any, name: str) -> tuple[tuple[int, float], ...]:
    """{token id (an int, or its decimal string as JSON keys are): bias in [-100, 100]} as sorted pairs."""
    if bias is None:
        return ()
    pairs = bias.items() if isinstance(bias, Mapping) else bias if isinstance(bias, (tuple, list)) else None
    if pairs is None:
        raise OptionError("logit_bias", f"{name}: expected a map of token ids to biases, found {bias!r:.80}")
    out = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise OptionError("logit_bias", f"{name}: expected a map of token ids to biases (or (id, bias) "
                                            f"pairs), found {bias!r:.80}")
        key, value = pair
        token = int(key) if isinstance(key, str) and key.isdigit() and key.isascii() else key
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise OptionError("logit_bias", f"{name}: keys must be token ids (integers >= 0), found {key!r:.40}")
        out[token] = check_number(f"{name}[{key!r:.40}]", value, -MAX_BIAS, MAX_BIAS, field="logit_bias")
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens and when it stops (vLLM's names and fields).

    The defaults are strata.defaults.SAMPLING_DEFAULTS, the rule `generate`, `chat` and `serve`
    follow too (temperature 0.8, top_k 40, other filters off, 256 tokens): the API samples, as
    llama-cpp-python's Llama does. `temperature=0` is greedy; a `seed` makes sampling reproducible.

    frequency_penalty / presence_penalty: OpenAI's additive penalties over generated tokens
    ([-2, 2], 0: off). logit_bias: {token id: bias in [-100, 100]} added to the logits (ids are
    checked against the model's vocabulary when a sequence is made). logprobs: None, or k in
    [0, 20]: report each sampled token's log-probability and the k likeliest alternatives
    (see the module docstring for which distribution). n: independent choices per request
    (choice i draws with seed + i). grammar: a `Grammar` the whole output must match (masked
    during sampling; see strata.engine.grammar), or GBNF text, or an OpenAI response_format
    ({"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}).
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
    frequency_penalty: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # 0: off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a dict is accepted
    logprobs: int | None = None  # None: off; k: the sampled token's and the k likeliest
    n: int = 1  # choices per request
    grammar: Grammar | None = None  # the output must match it; GBNF text or a response_format dict is accepted

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

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse logit_bias ids outside [0, vocab_size) (OptionError naming logit_bias)."""
        bad = [t for t, _ in self.logit_bias if t >= vocab_size]
        if bad:
            raise OptionError("logit_bias", f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")

    def for_choice(self, i: int) -> SamplingParams:
        """The params of choice i of n: its own seed (seed + i), so the choices differ and each is reproducible."""
        if i == 0 or self.seed is None:
            return self
        return _replace(self, seed=(self.seed + i) % (MAX_SEED + 1))


def replace_params(p: SamplingParams, **changes: Any) -> SamplingParams:
    """`p` with some fields changed (checked again)."""
    return _replace(p, **changes)


def _replace(p: SamplingParams, **changes: Any) -> SamplingParams:
    return SamplingParams(**{**{f: getattr(p, f) for f in FIELDS}, **changes})


#: SamplingParams' field names: the keyword options `generate` takes as sugar for one.
FIELDS = tuple(f.name for f in fields(SamplingParams))
DEFAULTS = {f.name: f.default for f in fields(SamplingParams)}


def apply_repetition_penalty(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    """One row [V] with CTRL's repetition penalty over `history` (a new tensor when it changes)."""
    return apply_penalties(logits[None], [_replace(SamplingParams(), repetition_penalty=penalty)], [list(history)],
                           [len(history)])[0]


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], histories: Sequence[Sequence[int]],
                    n_prompt: Sequence[int]) -> torch.Tensor:
    """Logits [B, V] with steps 1-3 of the module docstring applied, each as one indexed
    operation over the rows that ask for it; `logits` itself when no row does."""
    rep = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0 and histories[i]]
    additive = [i for i, p in enumerate(params) if (p.frequency_penalty or p.presence_penalty)
                and len(histories[i]) > n_prompt[i]]
    biased = [i for i, p in enumerate(params) if p.logit_bias]
    if not (rep or additive or biased):
        return logits
    logits = logits.clone()
    if rep:
        _repetition(logits, [(i, sorted(set(histories[i])), params[i].repetition_penalty) for i in rep])
    if additive:
        _additive(logits, [(i, histories[i][n_prompt[i]:], params[i]) for i in additive])
    if biased:
        rows = [i for i in biased for _ in params[i].logit_bias]
        ids = [t for i in biased for t, _ in params[i].logit_bias]
        bias = torch.tensor([b for i in biased for _, b in params[i].logit_bias], dtype=logits.dtype)
        logits.index_put_((torch.tensor(rows), torch.tensor(ids)), bias, accumulate=True)
    return logits


def _repetition(logits: torch.Tensor, rows: list[tuple[int, list[int], float]]) -> None:
    r = torch.tensor([i for i, ids, _ in rows for _ in ids])
    c = torch.tensor([t for _, ids, _ in rows for t in ids])
    penalty = torch.tensor([p for _, ids, p in rows for _ in ids], dtype=logits.dtype)
    picked = logits[r, c]
    logits[r, c] = torch.where(picked > 0, picked / penalty, picked * penalty)


def _additive(logits: torch.Tensor, rows: list[tuple[int, Sequence[int], SamplingParams]]) -> None:
    """OpenAI's `logit -= frequency * count + presence * (count > 0)` over generated tokens."""
    n_vocab = logits.shape[-1]
    flat = torch.tensor([i * n_vocab + t for i, out, _ in rows for t in out])
    keys, counts = torch.unique(flat, return_counts=True)  # (row, token) pairs and their counts
    r, c = keys // n_vocab, keys % n_vocab
    freq, pres = torch.zeros(logits.shape[0], dtype=logits.dtype), torch.zeros(logits.shape[0], dtype=logits.dtype)
    for i, _, p in rows:
        freq[i], pres[i] = p.frequency_penalty, p.presence_penalty
    logits[r, c] -= freq[r] * counts.to(logits.dtype) + pres[r]


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


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the k likeliest tokens' (likeliest first)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams], tokens: Sequence[int]) -> list[TokenLogprob]:
    """Log-probabilities of `tokens` under the processed logits [S, V] (after the penalties and
    bias) divided by each row's temperature (1 for a greedy row), with params[i].logprobs alternatives."""
    temps = torch.tensor([p.temperature or 1.0 for p in params], dtype=logits.dtype)
    lp = torch.log_softmax(logits / temps[:, None], dim=-1)  # [S, V]
    chosen = lp.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    k = max(p.logprobs for p in params)
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    out = []
    for row, (p, t) in enumerate(zip(params, tokens)):
        top = tuple(zip(top_i[row, :p.logprobs].tolist(), top_v[row, :p.logprobs].tolist()))
        out.append(TokenLogprob(t, chosen[row], top))
    return out


class Sampler:
    """The next-token rule of one sequence: its params, its own random generator and, when the
    params carry a grammar, its matcher (which needs the tokenizer's `Vocabulary`)."""

    def __init__(self, params: SamplingParams, vocab: Vocabulary | None = None):
        self.params = params
        if params.grammar is not None and vocab is None:
            raise OptionError("grammar", "grammar: a constrained sequence needs the tokenizer's vocabulary")
        self.matcher = Matcher(params.grammar, vocab) if params.grammar is not None else None
        self.generator = torch.Generator()
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, history: Sequence[int], n_prompt: int | None = None) -> int:
        """Next token id from logits [V] (float32) given the tokens so far (the first `n_prompt`
        of them the prompt; None: all of them, so no generated token is penalised additively)."""
        n = len(history) if n_prompt is None else n_prompt
        return sample_batch(logits[None], [self], [history], [n])[0][0]

    def draw(self, logits: torch.Tensor) -> int:
        """A token from one processed row [V] (penalties and bias applied): argmax when greedy."""
        if self.params.greedy:
            return int(logits.argmax())
        probs = filter_logits(logits, self.params).softmax(-1).cpu()
        if not torch.isfinite(probs).all():  # an infinite logit
            raise StrataError("sampling: the model's logits are not finite (corrupt weights or hyperparameters?)")
        return int(torch.multinomial(probs, 1, generator=self.generator))


def sample_batch(logits: torch.Tensor, samplers: Sequence[Sampler], histories: Sequence[Sequence[int]],
                 n_prompt: Sequence[int]) -> list[tuple[int, TokenLogprob | None]]:
    """The next token of each row of logits [S, V] (float32, CPU), and its log-probabilities for
    the rows whose params ask for them. Penalties and bias run once over the batch, then the
    grammar masks of the rows that have one (one bitmask for them all); each row then draws with
    its own generator (so a seeded row does not depend on the others) and advances its matcher."""
    if torch.isnan(logits).any():
        raise StrataError("sampling: the model's logits contain NaN (corrupt weights or hyperparameters?)")
    params = [s.params for s in samplers]
    processed = apply_penalties(logits, params, histories, n_prompt)
    constrained = [i for i, s in enumerate(samplers) if s.matcher is not None]
    if constrained:
        processed = processed.clone() if processed is logits else processed
        apply_masks(processed, constrained, [samplers[i].matcher for i in constrained])
    logits = processed
    tokens = [s.draw(row) for s, row in zip(samplers, logits)]
    for i in constrained:
        samplers[i].matcher.advance(tokens[i])
    asked = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[tuple[int, TokenLogprob | None]] = [(t, None) for t in tokens]
    if asked:
        lps = token_logprobs(logits[asked], [params[i] for i in asked], [tokens[i] for i in asked])
        for i, lp in zip(asked, lps):
            out[i] = (tokens[i], lp)
    return out


__all__ = ["DEFAULTS", "FIELDS", "Grammar", "MAX_BIAS", "MAX_LOGPROBS", "MAX_N", "MAX_SEED", "SAMPLING_RANGES", "Sampler",
           "SamplingParams", "TokenLogprob", "apply_penalties", "apply_repetition_penalty", "check_int", "check_number",
           "check_sampling", "filter_logits", "replace_params", "sample_batch", "token_logprobs"]
