"""A tool call cut by the token limit: finish_reason "length" and no half call in `tool_calls`,
streamed and whole. Each family's parser on a hand-written reply (a closed call, then one cut
inside), and end to end through the official `openai` client: the tiny model served in this
process with a small Hermes-style template, its sampler patched to write a tool call (as
tests/server/forced.py does) and max_tokens cutting it."""
from __future__ import annotations

import json

import pytest

from strata.engine.sampling import Sampler
from strata.server.tools import parser
from strata.server.tools.stream import OutputStream

from .forced import serve_in_thread


#: family -> (a closed call of add(a=1), the start of a second call the limit cut)
REPLIES = {
    "hermes": ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n',
               '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b'),
    "deepseek": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>"
                 "{\"a\": 1}<｜tool▁call▁end｜>",
                 "<｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 3, \"b"),
    "kimi": ("<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
             "{\"a\": 1}<|tool_call_end|>", "<|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>{\"a\": 3"),
    "mistral": ('[TOOL_CALLS]add[ARGS]{"a": 1}', '[TOOL_CALLS]add[ARGS]{"a": 3, "b'),
    "glm": ("<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
            "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>3</arg_value>\n<arg_key>b"),
    "qwen3-coder": ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=add>\n<parameter=a>\n3\n</parameter>\n<parameter=b>\n"),
    "harmony": ("<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1}<|call|>",
                "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 3"),
}


def streamed(out: OutputStream, text: str, cut: bool) -> tuple[str, list[dict]]:
    """(the content, the calls) a client assembles from `text` pushed a character at a time."""
    deltas = [d for ch in text for d in out.push(ch)] + out.finish(cut=cut)
    calls: dict[int, dict] = {}
    for d in deltas:
        for c in d.get("tool_calls", ()):
            entry = calls.setdefault(c["index"], {"name": "", "arguments": ""})
            entry["name"] += c["function"].get("name", "")
            entry["arguments"] += c["function"]["arguments"]
    return "".join(d.get("content", "") for d in deltas), list(calls.values())


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_cut_call_is_left_out_and_its_text_kept(family):
    closed, cut_call = REPLIES[family]
    whole = OutputStream(parser(family), None)
    whole.text = closed + cut_call
    message = whole.message(cut=True)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [("add", {"a": 1})], message
    assert message["content"].endswith(cut_call)  # llama-server's choice: the unfinished call's text is content
    content, calls = streamed(OutputStream(parser(family), None), closed + cut_call, cut=True)
    assert calls == [{"name": "add", "arguments": message["tool_calls"][0]["function"]["arguments"]}]
    assert content == message["content"]
    only_cut = OutputStream(parser(family), None)
    only_cut.text = cut_call
    assert only_cut.message(cut=True) == {"role": "assistant", "content": cut_call}


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_reply_that_ends_inside_a_call_keeps_it(family):
    """Not cut (the model itself stopped there): the unclosed call is read as it is, as before."""
    closed, cut_call = REPLIES[family]
    out = OutputStream(parser(family), None)
    out.text = closed + cut_call
    assert len(out.message(cut=False)["tool_calls"]) == 2


def test_a_reply_cut_by_the_limit_inside_a_name_marker_keeps_it_as_content():
    out = OutputStream(parser("hermes"), None)
    out.text = "Let me look.\n<tool_ca"
    assert out.message(cut=True) == {"role": "assistant", "content": "Let me look.\n<tool_ca"}
    assert streamed(OutputStream(parser("hermes"), None), "Let me look.\n<tool_ca", cut=True) == \
        ("Let me look.\n<tool_ca", [])


# ---- end to end: the official client on a served model ---------------------------------------

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")  # no tool markup of its own: the Hermes family, the default
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "add 3 and 3"}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 3}}\n</tool_call>'
TWO_CALLS = f'{CALL}\n<tool_call>\n{{"name": "add", "arguments": {{"a": 30, "b": 12}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def served(tiny_path):
    """(an `openai.OpenAI` on the tiny model served in this process, the model)."""
    yield from serve_in_thread(tiny_path, TEMPLATE, 512)


def force(monkeypatch, model, reply: str) -> list[int]:
    """Every sequence's sampler writes `reply`, then the end-of-generation token; its token ids."""
    ids = model.tokenize(reply, add_special=False)
    assert model.detokenize(ids) == reply
    forced = ids + [min(model.stop_token_ids)]

    def draw(self, logits):
        self.n_forced = getattr(self, "n_forced", -1) + 1
        return forced[min(self.n_forced, len(forced) - 1)]

    monkeypatch.setattr(Sampler, "draw", draw)
    return ids


def tokens_before(model, text: str, part: str) -> int:
    """Tokens of `text` up to and including the one where `part` begins."""
    ids = model.tokenize(text, add_special=False)
    return next(n for n in range(1, len(ids) + 1) if part in model.detokenize(ids[:n]))


def ask(client, max_tokens: int, stream: bool):
    """(finish_reason, content, [(name, arguments)]) of one request, whole or assembled from its stream."""
    if not stream:
        choice = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                                max_tokens=max_tokens).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
        return choice.finish_reason, choice.message.content, calls
    chunks = list(client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=max_tokens,
                                                 stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    parts: dict[int, list[str]] = {}
    for ch in choices:
        for tc in ch.delta.tool_calls or ():
            entry = parts.setdefault(tc.index, ["", ""])
            entry[0] += tc.function.name or ""
            entry[1] += tc.function.arguments or ""
    finishes = [ch.finish_reason for ch in choices if ch.finish_reason]
    assert len(finishes) == 1, finishes
    return finishes[0], "".join(ch.delta.content or "" for ch in choices), [tuple(p) for p in parts.values()]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_cut_by_max_tokens_says_length(served, monkeypatch, stream):
    client, model = served
    ids = force(monkeypatch, model, CALL)
    cut = tokens_before(model, CALL, '"b"')  # inside the arguments
    assert cut < len(ids)
    finish, content, calls = ask(client, cut, stream)
    assert finish == "length"
    assert calls == []  # no half call
    assert content == model.detokenize(ids[:cut])  # its text stays, as content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_whole_calls_before_the_cut_stay(served, monkeypatch, stream):
    client, model = served
    force(monkeypatch, model, TWO_CALLS)
    cut = tokens_before(model, TWO_CALLS, "30")
    finish, content, calls = ask(client, cut, stream)
    assert finish == "length"
    assert [(name, json.loads(args)) for name, args in calls] == [("add", {"a": 3, "b": 3})]
    assert content.lstrip().startswith("<tool_call>") and '"a": 3' in content  # the cut call's text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_uncut_call_says_tool_calls(served, monkeypatch, stream):
    client, model = served
    ids = force(monkeypatch, model, TWO_CALLS)
    finish, content, calls = ask(client, len(ids) + 8, stream)
    assert finish == "tool_calls"
    assert [(name, json.loads(args)) for name, args in calls] == [("add", {"a": 3, "b": 3}),
                                                                  ("add", {"a": 30, "b": 12})]
    assert not (content or "").strip()
