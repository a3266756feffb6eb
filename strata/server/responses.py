"""OpenAI response objects: whole completions, stream chunks, and the SSE stream of one request.

Chat answers are `chat.completion` / `chat.completion.chunk` objects, completions are
`text_completion` objects either way; a request with n > 1 has n choices, by index. A stream is
`data: {chunk}` events sharing one id: for chat a first chunk per choice with the assistant role,
then one chunk per piece of new text (whole UTF-8 characters: the tokenizer's stream decoder
holds back a split character) with the log-probabilities of its tokens when asked, split by the
choice's own `OutputStream` into `content`, `reasoning_content` and `tool_calls` deltas, a chunk
with each choice's finish reason (`tool_calls` when that choice called tools, `length` when it
was cut by its token limit, whatever it called: a call it was writing then is left out) and llama-server's
`timings` of that choice (a whole answer carries its first choice's), with
`stream_options.include_usage` a last chunk with empty `choices` and the usage totals, then
`data: [DONE]`. An error after the stream began is one `data: {"error": ...}` event, then `[DONE]`.

Must not touch the engine: it reads a request's `Event`s and writes JSON.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from strata.engine.sampling import TokenLogprob

from .protocol import GenerationRequest
from .tools.stream import OutputStream
from .worker import Event


#: Floor of a reported log-probability (JSON has no -inf; vLLM reports the same floor).
MIN_LOGPROB = -9999.0


@dataclass
class Reply:
    """The fixed parts of one request's answer; `token_bytes` (the tokenizer's bytes of each id)
    spells the tokens of its log-probabilities."""

    req: GenerationRequest
    model_name: str
    token_bytes: Sequence[bytes] = ()
    outputs: list[OutputStream] = field(default_factory=list)  # chat: each choice's reasoning and tool calls
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    _offsets: dict[int, int] = field(default_factory=dict)  # completions' text_offset so far, per choice

    def __post_init__(self):
        prefix = "chatcmpl" if self.req.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"

    @property
    def chat(self) -> bool:
        return self.req.kind == "chat"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name,
                "system_fingerprint": None}

    def whole(self, choices: list[Collected]) -> dict[str, Any]:
        """The non-streaming answer: one choice per collected sequence."""
        out = []
        for i, c in enumerate(choices):
            logprobs = self.logprobs(i, c.logprobs)
            if self.chat:
                output = self.output(i) or OutputStream()
                output.text = c.text
                message = output.message(cut=cut(c.last))
                finish = chat_finish(c.last, "tool_calls" in message)
                out.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
            else:
                out.append({"index": i, "text": c.text, "logprobs": logprobs, "finish_reason": finish_reason(c.last)})
        whole = {**self._head("chat.completion" if self.chat else "text_completion"), "choices": out,
                 "usage": usage([c.last for c in choices])}
        if choices[0].last.timings is not None:  # llama-server's, of the first choice
            whole["timings"] = choices[0].last.timings
        return whole

    def output(self, index: int) -> OutputStream | None:
        """Choice `index`'s OutputStream (None: its text goes out as it is)."""
        return self.outputs[index] if index < len(self.outputs) else None

    def chunk(self, index: int = 0, text: str | None = None, finish: str | None = None, role: bool = False,
              logprobs: dict[str, Any] | None = None, delta: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {**({"role": "assistant", "content": ""} if role else {}), **(delta or {})}
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if self.req.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, lasts: list[Event]) -> dict[str, Any]:
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage(lasts)}

    def logprobs(self, index: int, records: list[TokenLogprob]) -> dict[str, Any] | None:
        """OpenAI's logprobs object of these tokens of choice `index` (None when not asked for):
        chat's `content` entries, or completions' parallel lists (text_offset counts on across chunks)."""
        if self.req.sampling.logprobs is None:
            return None
        if self.chat:
            return {"content": [{**self._token(r.token_id, r.logprob),
                                 "top_logprobs": [self._token(t, lp) for t, lp in r.top]} for r in records]}
        tokens = [self._text(r.token_id) for r in records]
        offsets = []
        for t in tokens:
            offsets.append(self._offsets.get(index, 0))
            self._offsets[index] = offsets[-1] + len(t)
        return {"tokens": tokens, "token_logprobs": [_floor(r.logprob) for r in records],
                "top_logprobs": [{self._text(t): _floor(lp) for t, lp in r.top} for r in records],
                "text_offset": offsets}

    def _text(self, token_id: int) -> str:
        return self.token_bytes[token_id].decode("utf-8", errors="replace")

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self._text(token_id), "logprob": _floor(logprob), "bytes": list(self.token_bytes[token_id])}


def _floor(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


@dataclass
class Collected:
    """One choice of a whole answer: its text, its last event, its log-probability records."""

    text: str = ""
    last: Event | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Events:
    """The events of one request's tickets (one shared queue), those taken while waiting for the
    admissions replayed first."""

    def __init__(self, queue: asyncio.Queue, early: list[Event] = ()):
        self.queue, self.early = queue, deque(early)

    async def get(self) -> Event:
        return self.early.popleft() if self.early else await self.queue.get()


def finish_reason(last: Event) -> str:
    return last.finish_reason if last.finish_reason in ("stop", "length") else "stop"


def cut(last: Event) -> bool:
    """Whether the choice ended at its token limit (max_tokens, or the context full)."""
    return last.finish_reason == "length"


def chat_finish(last: Event, called: bool) -> str:
    """A chat choice's finish reason: "length" when cut (OpenAI and llama-server say so even after
    whole calls), else "tool_calls" when it called tools."""
    return "tool_calls" if called and not cut(last) else finish_reason(last)


def usage(lasts: list[Event]) -> dict[str, Any]:
    """Usage of the choices whose last events these are: the prompt once, every choice's tokens, and
    the prefix cache's share of the prompt."""
    prompt, completion = lasts[0].prompt_tokens, sum(e.completion_tokens for e in lasts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": lasts[0].cached_tokens}}


def sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def collect(events: Events, n: int) -> list[Collected]:
    """Every event of a request's n choices until each has its last, by choice index."""
    choices = [Collected() for _ in range(n)]
    done = 0
    while done < n:
        event = await events.get()
        if event.kind == "error":
            raise event.error
        c = choices[event.index]
        c.text += event.text
        c.logprobs += event.logprobs
        if event.finish_reason is not None:
            c.last, done = event, done + 1
    return choices


async def stream(reply: Reply, events: Events, n: int, on_error: Callable[[Any], None]) -> AsyncIterator[str]:
    """The SSE events of one request's n choices, from their events (the admissions already taken)."""
    if reply.chat:
        for i in range(n):
            yield sse(reply.chunk(i, role=True))
    lasts: dict[int, Event] = {}
    while len(lasts) < n:
        event = await events.get()
        if event.kind == "error":
            on_error(event.error)
            yield sse(event.error.body())
            break
        for piece in _pieces(reply, event):
            yield sse(piece)
        if event.finish_reason is not None:
            lasts[event.index] = event
            output = reply.output(event.index)
            last = reply.chunk(event.index, finish=chat_finish(event, output is not None and output.called))
            if event.timings is not None:  # as llama-server's last chunk carries them
                last["timings"] = event.timings
            yield sse(last)
    else:
        if reply.req.include_usage:
            yield sse(reply.usage_chunk([lasts[i] for i in range(n)]))
    yield sse("[DONE]")


def _pieces(reply: Reply, event: Event) -> list[dict[str, Any]]:
    """The chunks of one event: its text as it is, or split by its choice's OutputStream; the
    log-probabilities of its tokens ride on the first (on an empty delta when the stream holds
    the text back)."""
    i = event.index
    logprobs = reply.logprobs(i, event.logprobs)
    output = reply.output(i)
    if output is None or not reply.chat:
        return [reply.chunk(i, event.text, logprobs=logprobs)] if event.text or event.logprobs else []
    deltas = output.push(event.text) if event.text else []
    if event.finish_reason is not None:
        deltas += output.finish(cut=cut(event))
    if event.logprobs and not deltas:
        deltas = [{}]
    return [reply.chunk(i, delta=d, logprobs=logprobs if k == 0 else None) for k, d in enumerate(deltas)]


__all__ = ["Collected", "Events", "MIN_LOGPROB", "Reply", "collect", "sse", "stream"]
