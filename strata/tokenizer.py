"""The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), rebuilt with the `tokenizers` library.

Two families, as llama.cpp reads them:

* `gpt2`: byte-level BPE. Vocabulary and merges from the file; the pre-tokenizer is chosen by
  `tokenizer.ggml.pre` (llama.cpp's name for a split regex, see PRE_TOKENIZER_REGEXES), then
  bytes are mapped to printable characters (ByteLevel). `llama-bpe` vocabularies also take a
  whole pre-token straight from the vocabulary before merging (`ignore_merges`), as llama.cpp does.
* `llama`: SentencePiece. Spaces become U+2581, a space is prefixed to every text run (llama.cpp's
  `add_space_prefix`, after special tokens too), pieces merge highest score first, which is BPE
  with merges ranked by the score of the merged piece; unknown bytes fall back to <0xXX> tokens.

Tokens of type CONTROL (and USER_DEFINED) are added tokens: matched whole in the input text when
`parse_special`. Detokenization works on bytes (`token_bytes`), so a stream of tokens can be
turned into text with an incremental UTF-8 decoder that never splits a character.

Must not read files or download anything: it is rebuilt from the GGUF metadata handed in.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gguf.constants import Keys, TokenType
from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from strata.errors import StrataFormatError

SPM_SPACE = "\u2581"
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
OLMO_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

#: llama.cpp pre-tokenizer name (`tokenizer.ggml.pre`) -> the split regexes it stands for.
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (GPT2_REGEX,), "gpt-2": (GPT2_REGEX,), "gpt2": (GPT2_REGEX,),
    "llama-bpe": (LLAMA3_REGEX,), "llama3": (LLAMA3_REGEX,), "llama-v3": (LLAMA3_REGEX,),
    "smaug-bpe": (LLAMA3_REGEX,), "dbrx": (LLAMA3_REGEX,),
    "qwen2": (QWEN2_REGEX,), "olmo": (OLMO_REGEX,),
}
#: Pre-tokenizers whose vocabularies skip merging for pre-tokens found whole in the vocabulary.
IGNORE_MERGES = frozenset({"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx"})


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


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


@dataclass(frozen=True)
class SpecialTokens:
    bos: int | None
    eos: int | None
    eot: int | None
    pad: int | None
    unk: int | None
    add_bos: bool
    add_eos: bool


class Tokenizer:
    """Text <-> token ids for one model file. Build with `Tokenizer.from_metadata(metadata, path)`."""

    def __init__(self, hf: HFTokenizer, kind: str, tokens: list[str], types: list[int], special: SpecialTokens,
                 add_space_prefix: bool):
        self.hf, self.kind, self.tokens, self.types, self.special = hf, kind, tokens, types, special
        self.add_space_prefix = add_space_prefix
        self.token_bytes = [self._piece_bytes(i) for i in range(len(tokens))]

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], path: str = "model", vocab_size: int | None = None) -> Tokenizer:
        """The tokenizer of a file's metadata, every value checked first (`check_metadata`);
        `vocab_size`: rows of the model's output head, which the token list must match."""
        T = Keys.Tokenizer
        kind = metadata.get(T.MODEL)
        tokens = metadata.get(T.LIST)
        if kind is None or tokens is None:
            raise StrataFormatError(f"{path}: metadata keys {T.MODEL!r} and {T.LIST!r}: expected a tokenizer, "
                                    "found none")
        check_metadata(metadata, path, vocab_size)
        types = list(metadata.get(T.TOKEN_TYPE) or [TokenType.NORMAL] * len(tokens))
        special = SpecialTokens(
            bos=metadata.get(T.BOS_ID), eos=metadata.get(T.EOS_ID), eot=metadata.get(T.EOT_ID),
            pad=metadata.get(T.PAD_ID), unk=metadata.get(T.UNK_ID),
            add_bos=bool(metadata.get(T.ADD_BOS, kind == "llama")), add_eos=bool(metadata.get(T.ADD_EOS, False)))
        if kind == "gpt2":
            hf = _byte_level_bpe(metadata, tokens, path)
        elif kind == "llama":
            hf = _sentencepiece(metadata, tokens, types, special, path)
        else:
            raise StrataFormatError(f"{path}: metadata key {T.MODEL!r}: expected 'gpt2' or 'llama', found {kind!r}")
        _add_special_tokens(hf, tokens, types)
        return cls(hf, kind, list(tokens), types, special, bool(metadata.get(T.ADD_PREFIX, True)))

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

    def _piece_bytes(self, i: int) -> bytes:
        text, kind = self.tokens[i], self.types[i]
        if kind in (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN):
            return text.encode("utf-8")
        if kind == TokenType.UNUSED:
            return b""
        if self.kind == "gpt2":
            return bytes(_BYTE_DECODER.get(c, 0) for c in text) if all(c in _BYTE_DECODER for c in text) \
                else text.encode("utf-8")
        if kind == TokenType.BYTE:
            return bytes([int(text[3:-1], 16)])
        return text.replace(SPM_SPACE, " ").encode("utf-8")

    def is_special(self, token_id: int) -> bool:
        return self.types[token_id] == TokenType.CONTROL

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`, as the source tokenizer decodes it (invalid UTF-8 becomes U+FFFD)."""
        ids = [i for i in ids if not (skip_special and self.is_special(i))]
        data = b"".join(self.token_bytes[i] for i in ids)
        if self.kind == "llama" and self.add_space_prefix and data.startswith(b" "):
            data = data[1:]  # the space the tokenizer prefixed to the text
        return data.decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder for tokens that continue a text (no prefix-space removal)."""
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Token ids in, text out as soon as it is whole: a character split across tokens is held
    back until its last byte arrives."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self.skip_special and self.tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes[token_id])

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_SPECIAL_IDS = ("BOS_ID", "EOS_ID", "EOT_ID", "PAD_ID", "UNK_ID")  # the ones Strata uses
_FLAGS = ("ADD_BOS", "ADD_EOS", "ADD_PREFIX")


def _bad(path: str, key: str, expected: str, found: Any) -> StrataFormatError:
    return StrataFormatError(f"{path}: metadata key {key!r}: expected {expected}, found {found}")


def _strings(path: str, key: str, values: Any) -> list[str]:
    """`values` when it is a list of valid UTF-8 strings (GGUF strings decode losslessly, so bad
    bytes arrive as surrogates)."""
    if not isinstance(values, (list, tuple)):
        raise _bad(path, key, "an array of strings", type(values).__name__)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise _bad(path, key, "an array of strings", f"{type(v).__name__} at index {i}")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(path, key, "valid UTF-8 strings", f"invalid UTF-8 at index {i} ({v!r:.40})") from None
    return list(values)


def check_metadata(metadata: Mapping[str, Any], path: str, vocab_size: int | None = None) -> None:
    """Refuse tokenizer metadata that would break encoding or decoding later: lengths, element
    types, UTF-8, merges, byte tokens, special-token ids and flags. Errors name file and key."""
    T = Keys.Tokenizer
    tokens = _strings(path, T.LIST, metadata[T.LIST])
    n = len(tokens)
    if not n or (vocab_size is not None and n != vocab_size):
        raise _bad(path, T.LIST, f"{vocab_size} tokens (the rows of the output head)", f"{n}")
    types, scores = metadata.get(T.TOKEN_TYPE), metadata.get(T.SCORES)
    for key, values, ok, what in ((T.TOKEN_TYPE, types, lambda v: isinstance(v, int) and 0 <= v <= 6, "token types 0..6"),
                                  (T.SCORES, scores, lambda v: isinstance(v, (int, float)) and v == v, "numbers")):
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) != n:
            raise _bad(path, key, f"an array of {n} {what} (one per token)",
                       f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__)
        bad = next((i for i, v in enumerate(values) if isinstance(v, bool) or not ok(v)), None)
        if bad is not None:
            raise _bad(path, key, what, f"{values[bad]!r:.40} at index {bad}")
    if metadata.get(T.MODEL) == "llama" and types is not None:
        for i, ty in enumerate(types):
            if ty == TokenType.BYTE and not _BYTE_TOKEN.fullmatch(tokens[i]):
                raise _bad(path, T.LIST, "byte tokens spelled <0xXX>", f"{tokens[i]!r:.40} (token {i}, type BYTE)")
    merges = metadata.get(T.MERGES)
    if merges is not None:
        vocab = set(tokens)
        for i, m in enumerate(_strings(path, T.MERGES, merges)):
            pair = m.split(" ", 1)
            if len(pair) != 2 or not all(pair) or any(p not in vocab for p in pair) or "".join(pair) not in vocab:
                raise _bad(path, T.MERGES, "'LEFT RIGHT' pairs of tokens whose join is a token",
                           f"{m!r:.60} at index {i}")
    for name in _SPECIAL_IDS:
        key = getattr(T, name, None)
        value = metadata.get(key) if key else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n):
            raise _bad(path, key, f"a token id in [0, {n})", f"{value!r:.40}")
    for name in _FLAGS:
        value = metadata.get(getattr(T, name))
        if value is not None and not isinstance(value, bool):
            raise _bad(path, getattr(T, name), "a bool", f"{value!r:.40}")
    pre = metadata.get(T.PRE)
    if pre is not None and not isinstance(pre, str):
        raise _bad(path, T.PRE, "a string", f"{pre!r:.40}")


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated (padding) text keeps its first id
    return vocab


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: Sequence[str], path: str) -> HFTokenizer:
    merges = metadata.get(Keys.Tokenizer.MERGES)
    if merges is None:
        raise StrataFormatError(f"{path}: metadata key {Keys.Tokenizer.MERGES!r}: expected the BPE merges of a "
                                "'gpt2' tokenizer, found no such key")
    pre = metadata.get(Keys.Tokenizer.PRE, "default")
    if pre not in PRE_TOKENIZER_REGEXES:
        raise StrataFormatError(f"{path}: metadata key {Keys.Tokenizer.PRE!r}: expected one of "
                                f"{sorted(PRE_TOKENIZER_REGEXES)}, found {pre!r}")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    hf = HFTokenizer(models.BPE(_vocab(tokens), pairs, ignore_merges=pre in IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in PRE_TOKENIZER_REGEXES[pre]]
    hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                   use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece(metadata: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int],
                   special: SpecialTokens, path: str) -> HFTokenizer:
    scores = metadata.get(Keys.Tokenizer.SCORES)
    if scores is None:
        raise StrataFormatError(f"{path}: metadata key {Keys.Tokenizer.SCORES!r}: expected the piece scores of a "
                                "'llama' tokenizer, found no such key")
    vocab = _vocab(tokens)
    mergeable = [i for i, ty in enumerate(types) if ty == TokenType.NORMAL and len(tokens[i]) > 1]
    merges = []  # (score of the merged piece, its id, left, right): highest score first, as SentencePiece
    for i in mergeable:
        piece = tokens[i]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[i], i, left, right))
    merges.sort()
    unk = tokens[special.unk] if special.unk is not None else None
    hf = HFTokenizer(models.BPE(vocab, [(a, b) for _, _, a, b in merges], unk_token=unk, fuse_unk=True,
                                byte_fallback=True))
    steps = [normalizers.Replace(" ", SPM_SPACE)]
    if metadata.get(Keys.Tokenizer.ADD_PREFIX, True):
        steps.insert(0, normalizers.Prepend(SPM_SPACE))
    hf.normalizer = normalizers.Sequence(steps)
    hf.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def _add_special_tokens(hf: HFTokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    added = [AddedToken(tokens[i], special=ty == TokenType.CONTROL, normalized=False)
             for i, ty in enumerate(types) if ty in (TokenType.CONTROL, TokenType.USER_DEFINED)]
    hf.add_special_tokens([t for t in added if t.special])
    hf.add_tokens([t for t in added if not t.special])


__all__ = ["IGNORE_MERGES", "check_metadata", "PRE_TOKENIZER_REGEXES", "SpecialTokens", "StreamDecoder", "Tokenizer"]
