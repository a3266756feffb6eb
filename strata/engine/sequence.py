"""One generation request as plain data: prompt, output, cache position, stop rules, text.

No tensors here (the engine owns those), so stop-token, stop-string and length rules can be
tested without a model. Visible text is handed out in deltas; text that might be the start of a
stop string is held back until it is known not to be one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from strata.errors import StrataArgumentError

from .grammar import Vocabulary
from .sampling import Sampler, SamplingParams, TokenLogprob, check_int


class TokenDecoder(Protocol):
    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


@dataclass(frozen=True)
class StopConditions:
    max_tokens: int = 256  # tokens generated at most
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)  # end the output, not part of it
    stop_strings: tuple[str, ...] = ()  # end the output at the first occurrence, not part of it

    def __post_init__(self):
        check_int("max_tokens", self.max_tokens, 1, None)
        for s in self.stop_strings:
            if not isinstance(s, str) or not s:
                raise StrataArgumentError(f"stop: expected non-empty strings, found {s!r}")


def stop_conditions(params: SamplingParams, eog_ids: frozenset[int], room: int) -> StopConditions:
    """The stop rules of `params` for one prompt: its stop tokens, else the model's end-of-generation
    ones (`eog_ids`); its max_tokens, else the `room` left in the context."""
    stop_ids = eog_ids if params.stop_token_ids is None else params.stop_token_ids
    max_tokens = params.max_tokens if params.max_tokens is not None else max(room, 1)
    return StopConditions(max_tokens=max_tokens, stop_token_ids=stop_ids, stop_strings=params.stop)


class Sequence:
    def __init__(self, seq_id: int, prompt_ids: list[int], sampling: SamplingParams, stop: StopConditions,
                 decoder: TokenDecoder | None = None, vocab: Vocabulary | None = None):
        if not prompt_ids:
            raise StrataArgumentError("prompt: expected at least one token, found none (an empty prompt "
                                      "of a model that adds no BOS token)")
        self.seq_id, self.prompt_ids, self.stop = seq_id, list(prompt_ids), stop
        self.sampler = Sampler(sampling, vocab)  # vocab: the tokenizer's, for a grammar
        self.decoder = decoder
        self.output_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if sampling.logprobs is not None else None  # per output token
        self.slot: int | None = None  # KV-cache slot (the handle of its block table) while running
        self.n_cached = 0  # tokens whose keys and values are in the cache (0 again after a preemption)
        self.n_prompt_cached: int | None = None  # prompt tokens the prefix cache served at admission
        self.block_hashes: list[bytes] = []  # content hashes of its first full blocks (kv_cache.block_hashes)
        self.n_committed = 0  # blocks of its table registered in the prefix cache
        self.fork_of: Sequence | None = None  # n > 1: the choice whose prompt KV and logits it takes
        self.forks: list[Sequence] = []  # choices waiting for this one's prompt to be computed
        self.finish_reason: str | None = None  # "stop" | "length"
        self.text = ""  # output text so far (with a decoder), cut at a stop string
        self._emitted = 0  # characters of `text` already handed out
        self._cut = False  # the text ended at a stop string

    def fork_from(self, parent: Sequence) -> Sequence:
        """Make this sequence (a choice of the same prompt) share `parent`'s prompt: it joins when
        `parent`'s prompt is computed, with its KV blocks and its last logits (`Scheduler.fork`)."""
        if parent.prompt_ids != self.prompt_ids or parent is self:
            raise StrataArgumentError(f"sequence {self.seq_id}: forks only from another sequence of the same prompt")
        self.fork_of = parent
        return self

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def pending_ids(self) -> list[int]:
        """Tokens the model has not seen yet: the prompt at first, then the last sampled token."""
        return self.all_ids[self.n_cached:]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_id: int, logprob: TokenLogprob | None = None) -> str:
        """Record a sampled token (and its log-probabilities, when the sequence asked for them);
        returns the text that became visible (may be empty)."""
        if token_id in self.stop.stop_token_ids or self._grammar_ended():
            return self.finish("stop")
        self.output_ids.append(token_id)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)
        if self.decoder is not None:
            before = len(self.text)
            self.text += self.decoder.push(token_id)
            if self._cut_at_stop_string(before):
                return self.finish("stop")
        if len(self.output_ids) >= self.stop.max_tokens:
            return self.finish("length")
        return self._delta(final=False)

    def _grammar_ended(self) -> bool:
        """The grammar took its end token (it forces one once complete, even with ignore_eos)."""
        return self.sampler.matcher is not None and self.sampler.matcher.ended

    def finish(self, reason: str) -> str:
        """End the sequence; returns the text still held back."""
        if self.finish_reason is None:
            self.finish_reason = reason
            if self.decoder is not None and not self._cut:
                self.text += self.decoder.flush()  # bytes of an unfinished character become U+FFFD
        return self._delta(final=True)

    def _cut_at_stop_string(self, before: int) -> bool:
        longest = max((len(s) for s in self.stop.stop_strings), default=0)
        start = max(0, before - longest + 1)  # a stop string may begin in earlier text
        hits = [i for i in (self.text.find(s, start) for s in self.stop.stop_strings) if i >= 0]
        if hits:
            self.text, self._cut = self.text[:min(hits)], True
        return self._cut

    def _delta(self, final: bool) -> str:
        end = len(self.text) if final else len(self.text) - self._held_back()
        delta = self.text[self._emitted:end] if end > self._emitted else ""
        self._emitted = max(self._emitted, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        best = 0
        for s in self.stop.stop_strings:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best


__all__ = ["Sequence", "StopConditions", "TokenDecoder"]
