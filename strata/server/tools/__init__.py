"""Tool calling: the tool-call syntax of each model family read back into OpenAI `tool_calls`.

One file per family (a `Parser`); `detect(template)` picks the family from the chat template's
source (the markers it writes for an assistant's calls), `parser(name, tools)` builds one.
`--tool-call-format` forces a family. `stream.OutputStream` turns a growing reply into deltas.

Must not know HTTP or the engine: text in, calls out.
"""
from __future__ import annotations

from .base import Call, Parsed, Parser
from .harmony import HarmonyParser
from .hermes import HermesParser
from .llama3 import Llama3Parser
from .marked import DeepSeekParser, KimiParser, MistralParser
from .xml import GLMParser, QwenCoderParser

#: Family name -> parser class, in the order `detect` tries their markers.
FAMILIES: dict[str, type[Parser]] = {p.name: p for p in (
    HarmonyParser, DeepSeekParser, KimiParser, GLMParser, QwenCoderParser, MistralParser, HermesParser, Llama3Parser)}

#: Text in a template's source that marks each family (the first family matched wins).
_MARKERS = (("harmony", ("<|channel|>",)), ("deepseek", ("tool▁call▁begin",)),
            ("kimi", ("<|tool_calls_section_begin|>",)), ("glm", ("<arg_key>",)),
            ("qwen3-coder", ("<function=", "<parameter=")), ("mistral", ("[TOOL_CALLS]",)),
            ("hermes", ("<tool_call>",)), ("llama3", ("<|python_tag|>", "ipython")))
DEFAULT_FAMILY = "hermes"  # templates with no tool syntax of their own: the most common one


def detect(template_source: str | None) -> str:
    """The tool-call family whose syntax the template writes (DEFAULT_FAMILY when none is seen)."""
    source = template_source or ""
    for name, markers in _MARKERS:
        if all(m in source for m in markers):
            return name
    return DEFAULT_FAMILY


def parser(name: str, tools: list[dict] | None = None) -> Parser:
    cls = FAMILIES[name]
    return cls(tools) if name in ("glm", "qwen3-coder") else cls()


__all__ = ["Call", "DEFAULT_FAMILY", "FAMILIES", "Parsed", "Parser", "detect", "parser"]
