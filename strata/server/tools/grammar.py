"""`tool_choice` "required" or a named function enforced: a grammar of the family's tool-call
syntax whose arguments match the function's `parameters` schema, for the sampler to mask with.

Families with a grammar: Hermes / Qwen (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
one block per call) and Llama 3.x/4 (`{"name": ..., "parameters": {...}}`, several joined by "; ").
The others (harmony, DeepSeek, Kimi, GLM, Qwen3-Coder, Mistral) keep the best-effort behaviour:
the tools are rendered and the reply parsed, nothing is forced.

Must not know HTTP or the engine's internals: tools in, a `Grammar` out.
"""
from __future__ import annotations

import json

from strata.engine.grammar import Grammar, json_rule

from .request import ToolRequest

#: Family -> (what opens a call, what closes it, what separates two calls, the arguments' key).
SYNTAX = {"hermes": ("<tool_call>\n", "\n</tool_call>", "\n", "arguments"),
          "llama3": ("", "", "; ", "parameters")}


def _call_schema(tools: list[dict], key: str) -> dict:
    """The JSON schema of one call of any of `tools`: its name, and arguments matching its parameters."""
    options = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                  key: t["function"].get("parameters") or {"type": "object"}},
                "required": ["name", key], "additionalProperties": False} for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def forced_calls(tools: ToolRequest, family: str) -> Grammar | None:
    """The grammar of the reply `tools.choice` asks for ("required": calls of any tool; "named": of
    that one), in `family`'s syntax; None when nothing is forced or the family has no grammar here."""
    if tools.choice not in ("required", "named") or family not in SYNTAX or not tools.tools:
        return None
    chosen = [t for t in tools.tools if tools.choice == "required" or t["function"]["name"] == tools.named]
    open_, close, sep, key = SYNTAX[family]
    repeat = f" ({json.dumps(sep)} call)*" if tools.parallel else ""
    lark = (f"start: call{repeat}\n"
            f"call: {json.dumps(open_) + ' ' if open_ else ''}body{' ' + json.dumps(close) if close else ''}\n"
            f"body: {json_rule(_call_schema(chosen, key))}\n")
    return Grammar("lark", lark, field="tool_choice")


__all__ = ["SYNTAX", "forced_calls"]
