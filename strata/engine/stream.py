"""What generation hands back: `Chunk`s (one per token), a `Completion` per sequence, and
`Stream`, the iterator of one sequence's chunks.

A stream belongs to one sequence. Engine steps decode every running sequence together, so a
step driven by one stream (or by a blocking `generate`) also produces the other streams' tokens:
those wait in their stream's outbox (`Outboxes`) until that stream is iterated. Closing or
dropping a stream ends its own sequence only.

Must not schedule or run the model: it carries results between the engine and the caller.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

from .sampling import TokenLogprob


@dataclass
class Chunk:
    """One generated token of a stream and the text it made visible (may be empty)."""

    token_id: int | None  # None for the final chunk of a sequence that ended on a stop token
    text: str
    finish_reason: str | None = None  # set on a sequence's last chunk
    logprob: TokenLogprob | None = None  # the token's log-probabilities, when the sampling asked for them


@dataclass
class Completion:
    token_ids: list[int]  # generated tokens (without a stop token that ended them)
    text: str  # their text, cut before a stop string
    finish_reason: str  # "stop" (stop token or string), "length" (max_tokens or context full), "abort"
    prompt_tokens: int
    prefill_seconds: float  # prompt processing up to the first generated token
    decode_seconds: float  # the remaining tokens
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache held (not prefilled)
    logprobs: list[TokenLogprob] | None = None  # one per generated token, when the sampling asked for them

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first over the time they took."""
        n = len(self.token_ids) - 1
        return n / self.decode_seconds if n > 0 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"token_ids": self.token_ids, "text": self.text, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "tokens_per_second": self.tokens_per_second,
                "prefill_seconds": self.prefill_seconds, "decode_seconds": self.decode_seconds,
                "cached_tokens": self.cached_tokens,
                "logprobs": None if self.logprobs is None else
                [{"token_id": lp.token_id, "logprob": lp.logprob, "top": [list(t) for t in lp.top]}
                 for lp in self.logprobs]}


class Stream:
    """Iterate for one sequence's `Chunk`s as tokens are generated; `.completion` is set once it
    is exhausted. `close()` (or dropping the stream) ends that sequence and no other."""

    def __init__(self, chunks: Iterator[Chunk]):
        # The generator returns the Completion; it holds no reference back to this object, so a
        # dropped stream is freed (and its sequence cancelled) at once, not at a later GC pass.
        self._chunks = chunks
        self.completion: Completion | None = None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Chunk:
        try:
            return next(self._chunks)
        except StopIteration as stop:
            if stop.value is not None:
                self.completion = stop.value
            raise

    def close(self) -> None:
        """Stop generating (e.g. after Ctrl-C in the consumer); the sequence's slot is freed."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class Outboxes:
    """Chunks produced for open streams, by sequence id, until each stream takes its own."""

    def __init__(self) -> None:
        self._boxes: dict[int, deque[Chunk]] = {}

    def open(self, seq_id: int) -> deque[Chunk]:
        return self._boxes.setdefault(seq_id, deque())

    def close(self, seq_id: int) -> None:
        self._boxes.pop(seq_id, None)

    def put(self, seq_id: int, chunk: Chunk) -> None:
        box = self._boxes.get(seq_id)
        if box is not None:  # a blocking generate's sequence has no box: its text is in the sequence
            box.append(chunk)


__all__ = ["Chunk", "Completion", "Outboxes", "Stream"]
