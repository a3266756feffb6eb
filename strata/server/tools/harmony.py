"""gpt-oss's harmony format: a reply is messages `[<|start|>assistant]HEADER<|message|>BODY END`,
the header naming a channel (`<|channel|>analysis`, `commentary`, `final`) and for a tool call a
recipient (`to=functions.NAME`, before or after the channel; `<|constrain|>json` may follow),
END one of `<|end|>`, `<|call|>`, `<|return|>`. The analysis channel is reasoning, a message to
`functions.NAME` is a call whose body is the arguments, every other body is content."""
from __future__ import annotations

import re

from .base import Call, Parsed, Parser, held

MESSAGE, START = "<|message|>", "<|start|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>", START)
_TO = re.compile(r"to=(\S+?)(?=<\||\s|$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


class HarmonyParser(Parser):
    name = "harmony"
    markup = ("<|channel|>", "<|constrain|>", MESSAGE, *ENDS)

    def __init__(self, inline_reasoning: bool = False):
        self.inline_reasoning = inline_reasoning  # the analysis channel kept in the content

    def parse(self, text: str, final: bool = True) -> Parsed:
        out, pos = Parsed(), 0
        begin = 0  # where the message at `pos` begins, its <|start|> included
        while pos < len(text):
            head_end = text.find(MESSAGE, pos)
            if head_end < 0:
                if final and not out.calls and not out.content and MESSAGE not in text and "<|channel|>" not in text:
                    out.content = text  # no harmony at all: plain text
                elif "to=" in text[pos:]:  # a call's header, unfinished
                    out.open_at = begin
                break
            header, start = text[pos:head_end], head_end + len(MESSAGE)
            ends = [(i, e) for e in ENDS if (i := text.find(e, start)) >= 0]
            end, marker = min(ends) if ends else (-1, "")
            body = text[start:end] if end >= 0 else (text[start:] if final else held(text[start:], *ENDS))
            if _add(out, header, body, end >= 0, final, self.inline_reasoning) and end < 0:
                out.open_at = begin
            if end < 0:
                break
            pos = begin = end + (0 if marker == START else len(marker))
            if text.startswith(START, pos):
                pos += len(START)
        return out


def _add(out: Parsed, header: str, body: str, done: bool, final: bool, inline: bool) -> bool:
    """Add one message (`done`: its end marker was read); whether it is a call."""
    to = _TO.search(header)
    channel = _CHANNEL.search(header)
    if to is not None and to.group(1).startswith("functions."):
        arguments = body.strip() if done or final else body.lstrip()
        out.calls.append(Call(to.group(1).removeprefix("functions."), arguments, done))
        return True
    if channel is not None and channel.group(1) == "analysis" and not inline:
        out.reasoning += body
    else:
        out.content += body
    return False
