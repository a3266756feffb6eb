"""OpenAI response objects: whole completions, stream chunks, and the SSE stream of one request.

Chat answers are `chat.completion` / `chat.completion.chunk` objects, completions are
`text_completion` objects either way. A stream is `data: {chunk}` events sharing one id: for
chat a first chunk with the assistant role, then one chunk per piece of new text (whole UTF-8
characters: the tokenizer's stream decoder holds back a split character) split by the reply's
`OutputStream` into `content`, `reasoning_content` and `tool_calls` deltas, a chunk with the
finish reason (`tool_calls` when the reply called tools), with `stream_options.include_usage` a last chunk with empty `choices` and the
usage totals, then `data: [DONE]`. An error after the stream began is one `data: {"error": ...}`
event, then `[DONE]`.

Must not touch the engine: it reads a request's `Event`s and writes JSON.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from .protocol import GenerationRequest
from .tools.stream import OutputStream
from .worker import Event, Ticket


@dataclass
class Reply:
    """The fixed parts of one request's answer."""

    req: GenerationRequest
    model_name: str
    output: OutputStream | None = None  # chat: reasoning and tool calls read from the text
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        prefix = "chatcmpl" if self.req.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"

    @property
    def chat(self) -> bool:
        return self.req.kind == "chat"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_name,
                "system_fingerprint": None}

    def whole(self, text: str, last: Event) -> dict[str, Any]:
        """The non-streaming answer."""
        if self.chat:
            output = self.output or OutputStream()
            output.text = text
            message = output.message()
            finish = "tool_calls" if "tool_calls" in message else finish_reason(last)
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(last)}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(last)}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False,
              delta: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {**({"role": "assistant", "content": ""} if role else {}), **(delta or {})}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        out = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if self.req.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, last: Event) -> dict[str, Any]:
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage(last)}


def finish_reason(last: Event) -> str:
    return last.finish_reason if last.finish_reason in ("stop", "length") else "stop"


def usage(last: Event) -> dict[str, Any]:
    return {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": last.cached_tokens}}  # the prefix cache's share


def sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def collect(ticket: Ticket) -> tuple[str, Event]:
    """Every event of a ticket until its last: (the whole text, the last event)."""
    parts = []
    while True:
        event = await ticket.events.get()
        if event.kind == "error":
            raise event.error
        parts.append(event.text)
        if event.finish_reason is not None:
            return "".join(parts), event


async def stream(reply: Reply, ticket: Ticket, on_error: Callable[[Any], None]) -> AsyncIterator[str]:
    """The SSE events of one request, from its ticket's events (the first, 'added', already taken)."""
    if reply.chat:
        yield sse(reply.chunk(role=True))
    while True:
        event = await ticket.events.get()
        if event.kind == "error":
            on_error(event.error)
            yield sse(event.error.body())
            break
        for piece in _pieces(reply, event):
            yield sse(piece)
        if event.finish_reason is not None:
            called = reply.output is not None and reply.output.called
            yield sse(reply.chunk(finish="tool_calls" if called else finish_reason(event)))
            if reply.req.include_usage:
                yield sse(reply.usage_chunk(event))
            break
    yield sse("[DONE]")


def _pieces(reply: Reply, event: Event) -> list[dict[str, Any]]:
    """The chunks of one event's text: as it is, or split by the reply's OutputStream."""
    if reply.output is None or not reply.chat:
        return [reply.chunk(event.text)] if event.text else []
    deltas = reply.output.push(event.text) if event.text else []
    if event.finish_reason is not None:
        deltas += reply.output.finish()
    return [reply.chunk(delta=d) for d in deltas]


__all__ = ["Reply", "collect", "sse", "stream"]
