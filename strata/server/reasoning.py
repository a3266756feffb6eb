"""Reasoning split from the answer: `<think>...</think>` (Qwen3, QwQ, DeepSeek-R1, GLM-4.5+,
Kimi-K2-Thinking, MiniMax-M2) returned as `reasoning_content`, the name llama-server and vLLM
use. When the rendered prompt already opened `<think>` (DeepSeek-R1's and V3.1's generation
prompts do) the reply starts inside the reasoning. Formats: "auto" splits it off, "none" keeps
it inline in the content (llama-server's `--reasoning-format none`). gpt-oss's analysis channel
is split by its own parser (tools/harmony.py).

Must not know HTTP or the engine: text in, (reasoning, rest) out.
"""
from __future__ import annotations

from .tools.base import held

FORMATS = ("auto", "none")
OPEN, CLOSE = "<think>", "</think>"


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an opened `<think>` block."""
    return prompt.rstrip().endswith(OPEN)


class ThinkSplitter:
    def __init__(self, open_in_prompt: bool = False):
        self.open_in_prompt = open_in_prompt

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """(the reasoning, the rest) of a reply, or of a stream's prefix when not `final`: what
        might still turn out to be a tag is held back."""
        body = text
        if not self.open_in_prompt:
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                body = stripped[len(OPEN):]
            elif not final and OPEN.startswith(stripped):
                return "", ""
            else:
                return "", text
        end = body.find(CLOSE)
        if end < 0:  # unterminated: all of it is reasoning (a stream's prefix, or a reply cut by max_tokens)
            return (body if final else held(body, CLOSE)).lstrip(), ""
        return body[:end].lstrip(), body[end + len(CLOSE):].lstrip()


__all__ = ["FORMATS", "ThinkSplitter", "opens_thinking"]
