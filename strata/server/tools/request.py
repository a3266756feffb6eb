"""The tool fields of a chat request checked: `tools`, `tool_choice`, `parallel_tool_calls`, and
the `tool_calls` of assistant messages. Each error is a 400 naming its field."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..body import Refused, loads
from ..errors import bad_request

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
CHOICES = ("none", "auto", "required")


@dataclass
class ToolRequest:
    tools: list[dict] | None = None  # as the template receives them
    choice: str = "auto"  # none | auto | required | named
    named: str | None = None  # the function tool_choice names
    parallel: bool = True

    @property
    def parse_calls(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tool(t: Any, i: int) -> dict:
    param = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise bad_request(f"{param}: expected {{'type': 'function', 'function': {{...}}}}, found {_show(t)}", param=param)
    f = t["function"]
    if not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
        raise bad_request(f"{param}.function.name: expected 1 to 64 letters, digits, '_', '-' or '.', found "
                          f"{_show(f.get('name'))}", param=f"{param}.function.name")
    if f.get("description") is not None and not isinstance(f["description"], str):
        raise bad_request(f"{param}.function.description: expected a string", param=f"{param}.function.description")
    params = f.get("parameters")
    if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
        raise bad_request(f"{param}.function.parameters: expected a JSON schema object "
                          f"({{'type': 'object', ...}}), found {_show(params)}", param=f"{param}.function.parameters")
    return {"type": "function", "function": f}


def _choice(value: Any, names: list[str]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if isinstance(value, str):
        if value not in CHOICES:
            raise bad_request(f"tool_choice: expected one of {', '.join(CHOICES)} or a named function, found "
                              f"{_show(value)}", param="tool_choice")
        if value != "none" and not names:
            raise bad_request(f"tool_choice: {value!r} needs tools", param="tool_choice")
        return value, None
    f = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise bad_request(f"tool_choice: expected {{'type': 'function', 'function': {{'name': ...}}}}, found "
                          f"{_show(value)}", param="tool_choice")
    if f["name"] not in names:
        raise bad_request(f"tool_choice: function {f['name']!r} is not among the tools "
                          f"({', '.join(names) or 'none given'})", param="tool_choice")
    return "named", f["name"]


def tool_request(body: dict) -> ToolRequest:
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request(f"tools: expected a list of tools, found {_show(tools)}", param="tools")
    checked = [_tool(t, i) for i, t in enumerate(tools or ())]
    choice, named = _choice(body.get("tool_choice"), [t["function"]["name"] for t in checked])
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request(f"parallel_tool_calls: expected true or false, found {_show(parallel)}",
                          param="parallel_tool_calls")
    return ToolRequest(checked or None, choice, named, parallel)


def message_tool_calls(calls: Any, param: str) -> list[dict]:
    """An assistant message's `tool_calls` for the template: arguments given as JSON text become
    objects (templates write them with tojson, as transformers users pass them)."""
    if not isinstance(calls, list):
        raise bad_request(f"{param}: expected a list of tool calls, found {_show(calls)}", param=param)
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad_request(f"{param}[{j}]: expected {{'id', 'type': 'function', 'function': {{'name', "
                              f"'arguments'}}}}, found {_show(c)}", param=f"{param}[{j}]")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = loads(args) if args.strip() else {}
            except Refused as e:
                raise bad_request(f"{param}[{j}].function.arguments {e}: {_show(args)}",
                                  param=f"{param}[{j}].function.arguments") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out
