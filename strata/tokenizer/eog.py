"""End of generation, decided as llama.cpp's vocabulary loader decides it (llama-vocab.cpp).

Generation ends on any of: EOS, EOT and EOM (`tokenizer.ggml.{eos,eot,eom}_token_id`), the FIM
pad/repo/file-separator tokens, and every token whose text is in `EOG_TEXTS`; EOT, EOM and the FIM
tokens are found by their text when the file does not name them. Two exceptions, as there: a
vocabulary with `<|return|>` and `<|call|>` (gpt-oss's harmony format; solar-open's `<|calls|>` and
`<|flush|>`) keeps going after `<|end|>`, which closes a message, not the answer; and `</s>` is an
ordinary token where `<|tool_response>` or `<|plamo:eos|>` says it is (Gemma 4, PLaMo).

llama.cpp also marks the tokens it found by their text as CONTROL (so they are not spelled out
of, nor matched in, plain text), and renders four harmony tokens as text: `attributes` says which.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gguf.constants import TokenType

PREFIX = "tokenizer.ggml."
#: Texts llama.cpp reads as end of generation.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
#: Texts that name the EOT/EOM/FIM tokens when the file gives no id (key suffix -> texts); llama.cpp
#: makes the tokens so found CONTROL.
_BY_TEXT = {
    "eot_token_id": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                     "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"),
    "eom_token_id": ("<|eom_id|>",),
    "fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep_token_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_token_id": ("<|file_sep|>",),
    "fim_pre_token_id": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                         "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf_token_id": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                         "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid_token_id": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                         "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
}
_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: always shown as text


def _special_id(metadata: Mapping[str, Any], suffix: str, ids: Mapping[str, int]) -> int | None:
    """A special token's id: the file's key, else the first token spelled as llama.cpp expects."""
    value = metadata.get(PREFIX + suffix)
    if value is not None:
        return value
    return next((ids[t] for t in _BY_TEXT.get(suffix, ()) if t in ids), None)


def attributes(metadata: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int],
               default_eos: int | None) -> tuple[list[int], frozenset[int]]:
    """(token types as llama.cpp uses them, the end-of-generation ids). `default_eos`: llama.cpp's
    EOS for the vocabulary kind when the file has none."""
    ids = dict(zip(tokens, range(len(tokens))))  # a repeated text: its last id, as llama.cpp's map
    types = list(types)
    found = {suffix: _special_id(metadata, suffix, ids) for suffix in _BY_TEXT}
    named = {ids[t] for t in EOG_TEXTS if t in ids}
    for suffix, i in found.items():
        if i is not None and metadata.get(PREFIX + suffix) is None:
            named.add(i)  # found by its text
    for i in named:
        types[i] = TokenType.CONTROL
    eos = metadata.get(PREFIX + "eos_token_id", default_eos)
    eog = {ids[t] for t in EOG_TEXTS if t in ids}
    eog |= {i for key in ("eot_token_id", "eom_token_id", "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id")
            if (i := found[key]) is not None}
    if eos is not None and 0 <= eos < len(tokens):
        eog.add(eos)
    for t in _RENDERED:
        if t in ids:
            types[ids[t]] = TokenType.USER_DEFINED
    _harmony_end(tokens, types, eog)
    _normal_end_of_sentence(tokens, types, eog)
    return types, frozenset(eog)


def _harmony_end(tokens: Sequence[str], types: list[int], eog: set[int]) -> None:
    texts = {tokens[i]: i for i in eog}
    if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts)
                               or ("<|calls|>" in texts and "<|flush|>" in texts)):
        end = texts["<|end|>"]
        eog.discard(end)
        types[end] = TokenType.USER_DEFINED


def _normal_end_of_sentence(tokens: Sequence[str], types: list[int], eog: set[int]) -> None:
    texts = {tokens[i]: i for i in eog}
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        s = texts["</s>"]
        eog.discard(s)
        types[s] = TokenType.NORMAL
