"""The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), rebuilt with the `tokenizers` library
so that it gives the ids llama.cpp gives (tests/tokenizer holds it to llama.cpp's own vectors).

Vocabulary kinds (`tokenizer.ggml.model`), see models.py: `gpt2` (BPE, byte-level or on raw UTF-8,
with the pre-tokenizer named by `tokenizer.ggml.pre`: pretokenizers.py), `gemma4`, `llama`
(SentencePiece) and `bert` (WordPiece). Others (`t5`, `rwkv`, `plamo2`, ...) are refused by name.

Tokens of type CONTROL (and USER_DEFINED) are added tokens: matched whole in the input text when
`parse_special` (USER_DEFINED ones always). Detokenization works on bytes (`token_bytes`), so a
stream of tokens can be turned into text with an incremental UTF-8 decoder that never splits a
character. `eog_ids` are the tokens that end generation, as llama.cpp decides them (eog.py).

Must not read files or download anything: it is rebuilt from the GGUF metadata handed in.
"""
from __future__ import annotations

import codecs
import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Iterable, Mapping

from gguf.constants import Keys, TokenType
from tokenizers import Tokenizer as HFTokenizer

from strata.errors import StrataFormatError

from .eog import EOG_TEXTS, attributes
from .metadata import check_metadata
from .models import SPM_SPACE, add_special_tokens, bpe, newline_runs, pre_tokenizer, sentencepiece, wordpiece
from .pretokenizers import GPT2_REGEX, LLAMA3_REGEX, PRE_TOKENIZER_REGEXES, PRE_TOKENIZERS, QWEN2_REGEX

#: Vocabulary kinds read here -> llama.cpp's EOS when the file names none.
KINDS = {"gpt2": None, "gemma4": None, "llama": 2, "bert": None}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_DECODER = {ord(c): b for b, c in bytes_to_unicode().items()}  # str.translate table: chars -> latin-1
_NOT_A_BYTE = re.compile("[^\x00-\xff]")


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int | None
    eot: int | None
    pad: int | None
    unk: int | None
    add_bos: bool
    add_eos: bool
    eom: int | None = None


class Tokenizer:
    """Text <-> token ids for one model file. Build with `Tokenizer.from_metadata(metadata, path)`."""

    def __init__(self, hf: HFTokenizer, kind: str, tokens: list[str], types: list[int], special: SpecialTokens,
                 add_space_prefix: bool, eog_ids: frozenset[int] = frozenset(), byte_level: bool | None = None):
        self.hf, self.kind, self.tokens, self.types, self.special = hf, kind, tokens, types, special
        self.add_space_prefix = add_space_prefix
        self.byte_level = kind == "gpt2" if byte_level is None else byte_level
        #: Ids that end generation (EOS, EOT, EOM and the tokens llama.cpp reads as such by their text).
        self.eog_ids = eog_ids or frozenset(i for i in (special.eos, special.eot, special.eom) if i is not None)
        self.token_bytes = token_bytes(tokens, types, self.byte_level)
        self._control_ids: dict[frozenset[str], frozenset[int]] = {}

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], path: str = "model",
                      vocab_size: int | None = None) -> Tokenizer:
        """The tokenizer of a file's metadata, every value checked first (`check_metadata`);
        `vocab_size`: rows of the model's output head, which the token list must match."""
        T = Keys.Tokenizer
        kind = metadata.get(T.MODEL)
        tokens = metadata.get(T.LIST)
        if kind is None or tokens is None:
            raise StrataFormatError(f"{path}: metadata keys {T.MODEL!r} and {T.LIST!r}: expected a tokenizer, "
                                    "found none")
        if kind not in KINDS:
            raise StrataFormatError(f"{path}: metadata key {T.MODEL!r}: expected one of the tokenizer kinds Strata "
                                    f"reads ({', '.join(KINDS)}), found {kind!r}")
        merges = check_metadata(metadata, path, vocab_size)
        types, eog = attributes(metadata, tokens, metadata.get(T.TOKEN_TYPE) or [TokenType.NORMAL] * len(tokens),
                                KINDS[kind])
        hf, add_bos, byte_level, extra = cls._pipeline(metadata, kind, tokens, types, merges, path)
        add_special_tokens(hf, tokens, types, extra)
        special = SpecialTokens(
            bos=metadata.get(T.BOS_ID), eos=metadata.get(T.EOS_ID), eot=metadata.get(T.EOT_ID),
            pad=metadata.get(T.PAD_ID), unk=metadata.get(T.UNK_ID), add_bos=add_bos,
            add_eos=bool(metadata.get(T.ADD_EOS, False)), eom=metadata.get(T.EOM_ID))
        return cls(hf, kind, list(tokens), types, special, bool(metadata.get(T.ADD_PREFIX, kind == "llama")), eog,
                   byte_level)

    @staticmethod
    def _pipeline(metadata: Mapping[str, Any], kind: str, tokens: list[str], types: list[int],
                  merges: list[tuple[str, ...]] | None, path: str) -> tuple[HFTokenizer, bool, bool, list[str]]:
        """(the `tokenizers` pipeline, whether BOS is added, whether tokens are byte-level, texts
        matched whole before splitting)."""
        file_bos = metadata.get(Keys.Tokenizer.ADD_BOS)
        unk = metadata.get(Keys.Tokenizer.UNK_ID)
        if kind == "llama":
            add_bos = True if file_bos is None else bool(file_bos)
            return sentencepiece(metadata, tokens, types, unk, path), add_bos, False, []
        if kind == "bert":
            return wordpiece(metadata, tokens, unk, path), bool(file_bos), False, []
        pre = pre_tokenizer(metadata, path)
        add_bos = pre.always_bos or bool(pre.add_bos if file_bos is None else file_bos)
        whole = newline_runs(tokens) if pre.whole_newlines else []
        return bpe(metadata, tokens, merges, pre, path), add_bos, pre.byte_level, whole

    # -- text -> ids ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` adds BOS/EOS as the file asks, `parse_special` maps
        special-token text (e.g. '<|im_start|>') to its id instead of spelling it out."""
        self.hf.encode_special_tokens = not parse_special
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if add_special and self.special.add_bos and self.special.bos is not None:
            ids = [self.special.bos, *ids]
        if add_special and self.special.add_eos and self.special.eos is not None:
            ids = [*ids, self.special.eos]
        return ids

    # -- ids -> text ---------------------------------------------------------------------------

    def is_special(self, token_id: int) -> bool:
        return self.types[token_id] == TokenType.CONTROL

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`, as the source tokenizer decodes it (invalid UTF-8 becomes U+FFFD)."""
        ids = [i for i in ids if not (skip_special and self.is_special(i))]
        data = b"".join(self.token_bytes[i] for i in ids)
        if self.kind == "llama" and self.add_space_prefix and data.startswith(b" "):
            data = data[1:]  # the space the tokenizer prefixed to the text
        return data.decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False, keep: frozenset[int] = frozenset()) -> StreamDecoder:
        """An incremental decoder for tokens that continue a text (no prefix-space removal);
        `skip_special` leaves out control tokens except the ids in `keep`."""
        return StreamDecoder(self, skip_special, keep)

    def control_ids(self, texts: Iterable[str]) -> frozenset[int]:
        """The control tokens whose text is one of `texts` (markup a parser reads from the text),
        looked up once per set of texts."""
        key = frozenset(texts)
        found = self._control_ids.get(key)
        if found is None:
            found = self._control_ids[key] = frozenset(
                i for i, (text, kind) in enumerate(zip(self.tokens, self.types))
                if kind == TokenType.CONTROL and text in key)
        return found


def token_bytes(tokens: list[str], types: list[int], byte_level: bool) -> list[bytes]:
    """The bytes each token stands for: added tokens (CONTROL, USER_DEFINED, UNKNOWN) as written,
    byte-level text through GPT-2's table, <0xXX> as its byte, U+2581 as a space. It runs over the
    whole vocabulary at every load: byte-level text is translated in one piece."""
    out = _byte_level_bytes(tokens) if byte_level else [b""] * len(tokens)
    literal = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind in literal:
            out[i] = text.encode("utf-8")
        elif kind == TokenType.UNUSED:
            out[i] = b""
        elif byte_level:
            continue
        elif kind == TokenType.BYTE:
            out[i] = bytes([int(text[3:-1], 16)])
        else:
            out[i] = text.replace(SPM_SPACE, " ").encode("utf-8")
    return out


def _byte_level_bytes(tokens: list[str]) -> list[bytes]:
    """Every token through GPT-2's table (one byte per character); a token holding a character
    outside the table is not byte-level text and stands for its UTF-8."""
    translated = "".join(tokens).translate(_BYTE_DECODER)
    data = translated.encode("latin-1", errors="replace")  # one byte per character either way
    ends = list(accumulate(map(len, tokens)))
    out = [data[a:b] for a, b in zip([0, *ends], ends)]
    for m in _NOT_A_BYTE.finditer(translated):
        i = bisect_right(ends, m.start())
        out[i] = tokens[i].encode("utf-8")
    return out


class StreamDecoder:
    """Token ids in, text out as soon as it is whole: a character split across tokens is held
    back until its last byte arrives."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, keep: frozenset[int] = frozenset()):
        self.tokenizer, self.skip_special, self.keep = tokenizer, skip_special, keep
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self.skip_special and token_id not in self.keep and self.tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes[token_id])

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


__all__ = ["EOG_TEXTS", "GPT2_REGEX", "KINDS", "LLAMA3_REGEX", "PRE_TOKENIZERS", "PRE_TOKENIZER_REGEXES", "QWEN2_REGEX",
           "SpecialTokens", "StreamDecoder", "Tokenizer", "bytes_to_unicode", "check_metadata",
           "token_bytes"]
