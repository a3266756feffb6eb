"""OpenAI request bodies in, a checked `GenerationRequest` out; and a request's prompt as tokens.

`parse_chat` and `parse_completion` read `/v1/chat/completions` and `/v1/completions` bodies
(already decoded JSON) field by field: every wrong value is a 400 `APIError` naming its field
(`param`). The sampling fields (temperature, top_p, seed, n, frequency_penalty, presence_penalty,
logit_bias, stop, ...) go through `SamplingParams`' one validation; `logprobs` is chat's
`logprobs: true` with `top_logprobs` alternatives (0 to 20), or completions' `logprobs: k`.
Chat's `response_format` (json_object, json_schema) and llama-server's GBNF `grammar` become the
sampler's grammar, compiled here (one the engine cannot compile is a 400 naming the field).
Chat's `tools` / `tool_choice` / `parallel_tool_calls` are read by `tools.request`, and its
`reasoning_format` picks how reasoning is returned. Fields the engine cannot honour are refused
rather than ignored: `echo`, `suffix`, `best_of`. Unknown fields are ignored, as OpenAI's own
clients send extras. `ignore_eos` (vLLM's extension) runs to max_tokens.

`prompt_ids` turns a request into token ids with the model's tokenizer and chat template and
checks them (and logit_bias's ids) against the vocabulary and the context. Must not: touch the
engine, sample, or format responses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.chat_template import ChatTemplateError
from strata.engine.config import OptionError, spell
from strata.engine.sampling import MAX_LOGPROBS, SAMPLING_RANGES, SamplingParams, replace_params
from strata.defaults import SAMPLING_DEFAULTS
from strata.errors import StrataError

from .errors import bad_request
from .reasoning import FORMATS as REASONING_FORMATS, opens_thinking
from .tools.grammar import forced_calls
from .tools.request import ToolRequest, message_tool_calls, tool_request

MAX_STOP_STRINGS = 16
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


@dataclass
class GenerationRequest:
    kind: str  # "chat" | "completion"
    model: str | None
    messages: list[dict[str, Any]] | None = None  # chat
    prompt: str | list[int] | None = None  # completion: text, or token ids
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_tokens=None))  # to the context end
    stream: bool = False
    include_usage: bool = False
    tools: ToolRequest = field(default_factory=ToolRequest)  # chat: tools, tool_choice, parallel_tool_calls
    reasoning_format: str | None = None  # chat: "auto" | "none"; None: the server's --reasoning-format
    prompt_text: str = ""  # chat: the rendered prompt (whether it opened <think>)

    @property
    def max_tokens(self) -> int | None:
        return self.sampling.max_tokens

    @property
    def stop(self) -> tuple[str, ...]:
        return self.sampling.stop

    @property
    def n(self) -> int:
        return self.sampling.n


def _typed(body: dict, name: str, kinds: tuple[type, ...], what: str, default: Any = None) -> Any:
    """body[name] when it is one of `kinds` (bool is never a number); default when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    is_bool = isinstance(value, bool)
    if not isinstance(value, kinds) or (is_bool and bool not in kinds):
        raise bad_request(f"{name}: expected {what}, found {_show(value)}", param=name)
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int(body: dict, name: str, low: int | None, high: int | None = None) -> int | None:
    value = _typed(body, name, (int,), "an integer")
    if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
        bounds = " and ".join(b for b in ((f">= {low}" if low is not None else ""),
                                          (f"<= {high}" if high is not None else "")) if b)
        raise bad_request(f"{name}: expected an integer {bounds}, found {value}", param=name)
    return value


#: What a request that omits a field gets: the commands' sampling rule (strata.defaults, as llama.cpp's
#: server applies its own defaults), and no token limit but the context (OpenAI's).
SERVER_DEFAULTS = {**SAMPLING_DEFAULTS, "max_tokens": None}


#: The body fields read straight into SamplingParams (logprobs is read per endpoint).
SAMPLING_FIELDS = tuple(f for f in (*SAMPLING_RANGES, "max_tokens", "stop", "logit_bias") if f != "logprobs")


def _sampling(body: dict, kind: str) -> SamplingParams:
    """The request's SamplingParams, checked by SamplingParams itself: an error is a 400 naming the field."""
    names = {}
    if kind == "chat" and body.get("max_completion_tokens") is not None:  # the newer name wins
        names["max_tokens"] = "max_completion_tokens"
    values = {f: body.get(spell(f, names)) for f in SAMPLING_FIELDS}
    if values["top_k"] == -1:  # vLLM's spelling of "off"
        values["top_k"] = 0
    values = {f: SERVER_DEFAULTS[f] if v is None and f in SERVER_DEFAULTS else v for f, v in values.items()}
    values["logprobs"] = _chat_logprobs(body) if kind == "chat" else body.get("logprobs")
    values["grammar"], names["grammar"] = _grammar_field(body, kind)
    if _typed(body, "ignore_eos", (bool,), "true or false", False):  # vLLM's extension: run to max_tokens
        values["stop_token_ids"] = ()
    if isinstance(values["stop"], list) and len(values["stop"]) > MAX_STOP_STRINGS:
        raise bad_request(f"stop: expected at most {MAX_STOP_STRINGS} strings, found {len(values['stop'])}",
                          param="stop")
    if isinstance(values["logprobs"], bool):
        raise bad_request(f"logprobs: expected an integer (alternatives per token, 0 to {MAX_LOGPROBS}), found "
                          f"{values['logprobs']}", param="logprobs")
    try:
        return SamplingParams.build(names, **{f: v for f, v in values.items()
                                              if v is not None or f in ("max_tokens", "logprobs")})
    except OptionError as e:
        param = "top_logprobs" if kind == "chat" and e.option == "logprobs" else spell(e.option, names)
        raise bad_request(str(e).replace("logprobs:", f"{param}:", 1), param=param) from None


def _grammar_field(body: dict, kind: str) -> tuple[Any, str]:
    """The request's grammar as SamplingParams reads it, and the field it came from: chat's
    `response_format` (json_object / json_schema) or llama-server's GBNF `grammar`, not both."""
    fmt = body.get("response_format") if kind == "chat" else None
    gbnf = _typed(body, "grammar", (str,), "GBNF text")
    if fmt is not None and not isinstance(fmt, dict):
        raise bad_request(f"response_format: expected an object, found {_show(fmt)}", param="response_format")
    if fmt is not None and fmt.get("type", "text") != "text":
        if gbnf is not None:
            raise bad_request("grammar: give response_format or grammar, not both", param="grammar")
        return fmt, "response_format"
    return gbnf, "grammar"


def _chat_logprobs(body: dict) -> int | None:
    """Chat's pair as the sampler's one option: None (off), or top_logprobs (0 when absent) with logprobs true."""
    wanted = _typed(body, "logprobs", (bool,), "true or false", False)
    top = body.get("top_logprobs")
    if top is not None and not wanted:
        raise bad_request("top_logprobs: only allowed when logprobs is true", param="top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool)):
        raise bad_request(f"top_logprobs: expected an integer from 0 to {MAX_LOGPROBS}, found {_show(top)}",
                          param="top_logprobs")
    return (top or 0) if wanted else None


def _refuse_unsupported(body: dict, kind: str) -> None:
    best_of = _int(body, "best_of", 1)
    if best_of is not None and best_of != 1:
        raise bad_request(f"best_of: only 1 is supported, found {best_of}", param="best_of")
    if kind != "chat":
        if body.get("echo"):
            raise bad_request("echo: not supported", param="echo")
        if body.get("suffix"):
            raise bad_request("suffix: not supported (no fill-in-the-middle)", param="suffix")


def _common(body: Any, kind: str) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, found {type(body).__name__}")
    model = _typed(body, "model", (str,), "a string")
    _refuse_unsupported(body, kind)
    stream = _typed(body, "stream", (bool,), "true or false", False)
    options = _typed(body, "stream_options", (dict,), "an object")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options: only allowed when stream is true", param="stream_options")
        include_usage = _typed(options, "include_usage", (bool,), "true or false", False)
    return GenerationRequest(kind, model, sampling=_sampling(body, kind), stream=stream, include_usage=include_usage)


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{param}: expected an object with 'role' and 'content', found {_show(m)}", param=param)
    role = m.get("role")
    if role not in ROLES:
        raise bad_request(f"{param}.role: expected one of {', '.join(ROLES)}, found {_show(role)}",
                          param=f"{param}.role")
    content = m.get("content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{param}.content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are "
                                  f"supported, found {_show(part)}", param=f"{param}.content")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is None and role != "assistant":
        raise bad_request(f"{param}.content: expected a string", param=f"{param}.content")
    elif content is not None and not isinstance(content, str):
        raise bad_request(f"{param}.content: expected a string or a list of text parts, found {_show(content)}",
                          param=f"{param}.content")
    out = {k: v for k, v in m.items() if k in ("name", "tool_call_id") and isinstance(v, str)}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = message_tool_calls(m["tool_calls"], f"{param}.tool_calls")
    if role == "assistant" and isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]
    return {"role": "system" if role == "developer" else role, "content": content or "", **out}


def parse_chat(body: Any) -> GenerationRequest:
    req = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"messages: expected a non-empty list of messages, found {_show(messages)}",
                          param="messages")
    req.messages = [_message(m, i) for i, m in enumerate(messages)]
    req.tools = tool_request(body)
    fmt = _typed(body, "reasoning_format", (str,), "a string")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise bad_request(f"reasoning_format: expected one of {', '.join(REASONING_FORMATS)}, found {_show(fmt)}",
                          param="reasoning_format")
    req.reasoning_format = fmt
    return req


def parse_completion(body: Any) -> GenerationRequest:
    req = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        req.prompt = list(prompt)
    elif isinstance(prompt, str):
        req.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"prompt: one prompt per request is supported, found {len(prompt)}", param="prompt")
    else:
        raise bad_request(f"prompt: expected a string or a non-empty list of token ids, found {_show(prompt)}",
                          param="prompt")
    return req


def prompt_ids(req: GenerationRequest, model) -> list[int]:
    """The request's prompt as token ids: messages through the model's chat template, text with
    the file's BOS rule, ids as given (checked against the vocabulary). 400 when it does not fit."""
    param = "messages" if req.kind == "chat" else "prompt"
    if req.kind == "chat":
        try:
            tools = {"tools": req.tools.tools} if req.tools.tools else {}
            text = req.prompt_text = model.apply_chat_template(req.messages, add_generation_prompt=True, **tools)
        except ChatTemplateError as e:
            raise bad_request(f"messages: the model's chat template refused them: {e}", param="messages") from None
        except StrataError as e:  # no template in the file
            raise bad_request(f"{e}; use /v1/completions", param="messages") from None
        ids = model.tokenize(text, add_special=False)
    elif isinstance(req.prompt, str):
        ids = model.tokenize(req.prompt)
    else:
        vocab = model.tokenizer.vocab_size
        bad = next((t for t in req.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"prompt: token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
        ids = list(req.prompt)
    if not ids:
        raise bad_request(f"{param}: the prompt is empty (no tokens)", param=param)
    try:
        req.sampling.check_vocab(model.tokenizer.vocab_size)
    except OptionError as e:
        raise bad_request(str(e), param="logit_bias") from None
    if len(ids) >= model.n_ctx:
        raise bad_request(f"{param}: the prompt has {len(ids)} tokens; this server's context is {model.n_ctx} tokens "
                          f"and at least one must be left to generate", param=param, code="context_length_exceeded")
    return ids


def constrained(req: GenerationRequest, family: str) -> SamplingParams:
    """A chat request's sampling with its grammar completed once the prompt is rendered: the forced
    tool calls of tool_choice required / named (in the template family's syntax), and the end of a
    `<think>` block the prompt opened written first (the grammar applies to the answer)."""
    grammar, forced = req.sampling.grammar, None
    if req.tools.choice in ("required", "named"):
        try:
            forced = forced_calls(req.tools, family)
        except OptionError as e:
            raise bad_request(str(e), param="tool_choice") from None
        if forced is not None and grammar is not None:
            raise bad_request("response_format: cannot be combined with tool_choice required or a named "
                              "function (the reply is a tool call)", param="response_format")
    grammar = forced or grammar
    if grammar is None:
        return req.sampling
    if opens_thinking(req.prompt_text):
        grammar = grammar.with_prefix("</think>\n\n")
    return replace_params(req.sampling, grammar=grammar)


__all__ = ["GenerationRequest", "constrained", "parse_chat", "parse_completion", "prompt_ids"]
