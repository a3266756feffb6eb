"""Constrained decoding: a grammar a sequence's output must match, enforced as a mask on its logits.

A `Grammar` is plain, hashable data (its kind and source text), so it rides in the frozen
`SamplingParams`; it is compiled (checked) when made, so a schema the engine cannot compile is
refused before a sequence exists. `Vocabulary` is the engine's view of one tokenizer (each
token's bytes and the end-of-generation ids), built once per tokenizer. A `Matcher` is one
sequence's state: the mask of tokens allowed next, advanced with each sampled token; when the
grammar is complete only the end-of-generation tokens are allowed, so a finished grammar forces EOS.

The engine is llguidance (a small Rust wheel with no dependencies), chosen over xgrammar, whose
wheel requires torch, transformers, triton, pydantic and apache-tvm-ffi (xgrammar was not timed).
Filling and applying a mask costs a small share of a decode step on a real vocabulary, more in open
string states (benchmarks/grammar_mask.py; figures: benchmarks/RESULTS.md, "Grammar masks");
building the Vocabulary reads every token and takes seconds on a large vocabulary, so it is built
once per tokenizer (`strata serve` builds it on a thread at start: `Model.prepare_grammar`; a
constrained request that comes before it is ready waits for that one build).
The mask is filled through the matcher's own call, not llguidance.torch: importing that module
compiles a kernel with torch.compile, which imports torch._dynamo (seconds, on the first
constrained request).
JSON schemas compile with compact separators (", " and ": ") and no free whitespace, as
OpenAI's strict mode writes JSON (and so a random model cannot pad forever).

Must not touch the model or the KV cache.
"""
from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from .config import OptionError

KINDS = ("json_schema", "lark", "gbnf")
#: JSON written as OpenAI's strict mode writes it: one space after ',' and ':', no other whitespace.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    import llguidance

    return llguidance


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


def json_rule(schema: Mapping[str, Any]) -> str:
    """A Lark rule body matching JSON that validates against `schema` (compact, as JSON_OPTIONS)."""
    return "%json " + json.dumps({**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}})


@dataclass(frozen=True)
class Grammar:
    """What a sequence's whole output must match: `kind` "json_schema" (source: the schema as JSON
    text; `{"type": "object"}` is JSON mode), "lark" (llguidance's Lark dialect, `%json` rules
    included) or "gbnf" (llama.cpp's GBNF); `prefix` is literal text forced before it (e.g. the
    end of an opened `<think>` block). Checked when made: an OptionError naming `field`."""

    kind: str
    source: str
    prefix: str = ""
    field: str = "grammar"  # the option or request field errors name

    def __post_init__(self):
        if self.kind not in KINDS:
            raise OptionError(self.field, f"{self.field}: grammar kind must be one of {', '.join(KINDS)}, "
                                          f"found {self.kind!r}")
        if not isinstance(self.source, str) or not isinstance(self.prefix, str):
            raise OptionError(self.field, f"{self.field}: expected grammar text, found {self.source!r:.80}")
        error = _llguidance().LLMatcher.validate_grammar(self.compiled())
        if error and not error.startswith("WARNING"):
            raise OptionError(self.field, f"{self.field}: the grammar engine cannot compile it: "
                                          f"{error.strip().splitlines()[0]:.300}")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any], field: str = "grammar") -> Grammar:
        if not isinstance(schema, Mapping):
            raise OptionError(field, f"{field}: a JSON schema must be an object, found {schema!r:.80}")
        return cls("json_schema", json.dumps(schema), field=field)  # key order kept: output follows it

    @classmethod
    def json_object(cls, field: str = "grammar") -> Grammar:
        return cls.json_schema({"type": "object"}, field)

    @classmethod
    def from_response_format(cls, fmt: Any, field: str = "response_format") -> Grammar | None:
        """OpenAI's `response_format`: None for {"type": "text"}, else the grammar of json_object or
        json_schema ({"json_schema": {"name": ..., "schema": {...}, "strict": ...}})."""
        kind = fmt.get("type") if isinstance(fmt, Mapping) else None
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object(field)
        spec = fmt.get("json_schema") if kind == "json_schema" else None
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
            raise OptionError(field, f"{field}: expected {{'type': 'text' | 'json_object'}} or {{'type': "
                                     f"'json_schema', 'json_schema': {{'name': ..., 'schema': {{...}}}}}}, "
                                     f"found {fmt!r:.80}")
        return cls.json_schema(spec.get("schema") or {"type": "object"}, field)

    def with_prefix(self, prefix: str) -> Grammar:
        return Grammar(self.kind, self.source, prefix + self.prefix, self.field) if prefix else self

    def compiled(self) -> str:
        """The grammar as llguidance reads it (a Lark text, or its JSON list of grammars)."""
        if self.kind == "json_schema":
            body = json_rule(json.loads(self.source))
            return f"start: {_lark_string(self.prefix)} body\nbody: {body}\n" if self.prefix else f"start: {body}\n"
        lark = self.source
        if self.kind == "gbnf":
            from llguidance.gbnf_to_lark import gbnf_to_lark

            try:
                lark = gbnf_to_lark(self.source)
            except Exception as e:  # its converter raises bare Exceptions on bad GBNF
                raise OptionError(self.field, f"{self.field}: not valid GBNF: {e}") from None
        if not self.prefix:
            return lark
        main = f"start: {_lark_string(self.prefix)} @body\n"
        return json.dumps({"grammars": [{"lark_grammar": main}, {"name": "body", "lark_grammar": lark}]})


class _Wrapped:
    """The tokenizer as llguidance's TokenizerWrapper reads one: token bytes, EOS, specials, encode."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int]):
        self.tokens = tokenizer.token_bytes
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = None
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]
        self._tokenizer = tokenizer

    def __call__(self, data: bytes) -> list[int]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


class Vocabulary:
    """One tokenizer as the grammar engine sees it (built once per tokenizer: see `vocabulary`)."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int]):
        if not eos_ids:
            raise OptionError("grammar", "grammar: the model has no end-of-generation token to end a grammar with")
        lg = _llguidance()
        self.eos_ids = tuple(sorted(eos_ids))
        self.n_vocab = tokenizer.vocab_size
        self.ll = lg.LLTokenizer(lg.TokenizerWrapper(_Wrapped(tokenizer, self.eos_ids)), n_vocab=self.n_vocab,
                                 eos_token=list(self.eos_ids))


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILDING = threading.Lock()  # one build at a time: a caller during a build waits for its result


def vocabulary(tokenizer: Any, eos_ids: Sequence[int]) -> Vocabulary:
    """The tokenizer's Vocabulary, cached per tokenizer object (building one reads every token:
    seconds on a 150k vocabulary). Thread-safe: callers while it is built wait for that build."""
    key = tuple(sorted(eos_ids))
    with _BUILDING:
        cached = _VOCABULARIES.get(tokenizer)
        if cached is None or cached.eos_ids != key:
            cached = _VOCABULARIES[tokenizer] = Vocabulary(tokenizer, key)
        return cached


def is_built(tokenizer: Any, eos_ids: Sequence[int]) -> bool:
    """Whether `vocabulary(tokenizer, eos_ids)` would answer at once (no build)."""
    cached = _VOCABULARIES.get(tokenizer)
    return cached is not None and cached.eos_ids == tuple(sorted(eos_ids))


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, grammar: Grammar, vocab: Vocabulary):
        self.vocab = vocab
        self.ll = _llguidance().LLMatcher(vocab.ll, grammar.compiled(), log_level=0)
        self.ended = False  # the grammar took its end-of-generation token: the sequence is complete
        self._check()

    def _check(self) -> None:
        if self.ll.is_error():
            raise OptionError("grammar", f"grammar: {self.ll.get_error()}")

    def advance(self, token_id: int) -> None:
        """Consume a sampled token (one the mask allowed)."""
        self.ll.consume_token(token_id)
        self._check()
        self.ended = token_id in self.vocab.eos_ids


def apply_masks(logits: torch.Tensor, rows: Sequence[int], matchers: Sequence[Matcher]) -> None:
    """Set to -inf, in place, the tokens each matcher forbids in its row of logits [B, V]: one
    packed bitmask [G, ceil(V/32)] filled by the engine, expanded and applied to the G rows at once."""
    n_vocab = logits.shape[-1]
    bits = torch.full((len(rows), -(-n_vocab // 32)), -1, dtype=torch.int32)  # [G, W], one bit per token
    row_bytes = bits.shape[1] * bits.element_size()
    for g, m in enumerate(matchers):
        m.ll.unsafe_compute_mask_ptr(bits[g].data_ptr(), row_bytes)  # writes row g: contiguous, CPU, int32
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bits[:, :, None] >> shifts) & 1).bool().flatten(1)[:, :n_vocab]  # [G, V]
    index = torch.tensor(list(rows))
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


__all__ = ["Grammar", "JSON_OPTIONS", "KINDS", "Matcher", "Vocabulary", "apply_masks", "is_built", "json_rule", "vocabulary"]
