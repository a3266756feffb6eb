"""Checks on a file's tokenizer metadata (`tokenizer.ggml.*`) before anything is built from it:
every refusal is one StrataFormatError naming the file and the key, what was expected and found."""
from __future__ import annotations

import math
import re
from itertools import repeat
from operator import itemgetter
from typing import Any, Mapping, Sequence

from gguf.constants import Keys, TokenType

from strata.errors import StrataFormatError

T = Keys.Tokenizer
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_SPECIAL_IDS = ("BOS_ID", "EOS_ID", "EOT_ID", "EOM_ID", "PAD_ID", "UNK_ID", "SEP_ID", "MASK_ID",
                "FIM_PRE_ID", "FIM_SUF_ID", "FIM_MID_ID", "FIM_PAD_ID", "FIM_REP_ID", "FIM_SEP_ID")
_FLAGS = ("ADD_BOS", "ADD_EOS", "ADD_PREFIX")
_TYPES = set(range(7))


def bad(path: str, key: str, expected: str, found: Any) -> StrataFormatError:
    return StrataFormatError(f"{path}: metadata key {key!r}: expected {expected}, found {found}")


def split_merge(merge: str) -> tuple[str, str]:
    """A merge's two tokens, cut where llama.cpp cuts it: at the first space after its first byte."""
    cut = merge.find(" ", 1)
    return (merge[:cut], merge[cut + 1:]) if cut > 0 else (merge, "")


def merge_pairs(merges: Sequence[str]) -> list[tuple[str, ...]]:
    """Every merge's tokens (`split_merge`; str.split where no merge starts with a space: faster).
    A merge without a space gives a 1-tuple."""
    if any(map(str.startswith, merges, repeat(" "))):
        return [split_merge(m) for m in merges]
    return list(map(tuple, map(str.split, merges, repeat(" "), repeat(1))))


def _strings(path: str, key: str, values: Any) -> list[str]:
    """`values` when it is a list of valid UTF-8 strings (GGUF strings decode losslessly, so bad
    bytes arrive as surrogates)."""
    if not isinstance(values, (list, tuple)):
        raise bad(path, key, "an array of strings", type(values).__name__)
    if not set(map(type, values)) <= {str}:
        i, v = next((i, v) for i, v in enumerate(values) if type(v) is not str)
        raise bad(path, key, "an array of strings", f"{type(v).__name__} at index {i}")
    try:
        "".join(values).encode("utf-8")
    except UnicodeEncodeError:
        i = next(i for i, v in enumerate(values) if not v.isascii() and _invalid_utf8(v))
        raise bad(path, key, "valid UTF-8 strings", f"invalid UTF-8 at index {i} ({values[i]!r:.40})") from None
    return list(values)


def _invalid_utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def check_metadata(metadata: Mapping[str, Any], path: str,
                   vocab_size: int | None = None) -> list[tuple[str, ...]] | None:
    """Refuse tokenizer metadata that would break encoding or decoding later: lengths, element
    types, UTF-8, merges, byte tokens, special-token ids and flags. Errors name file and key.
    Returns the merges as token pairs (None without merges), for the BPE builder."""
    tokens = _strings(path, T.LIST, metadata[T.LIST])
    n = len(tokens)
    if not n or (vocab_size is not None and n != vocab_size):
        raise bad(path, T.LIST, f"{vocab_size} tokens (the rows of the output head)", f"{n}")
    _check_per_token(metadata, path, n)
    types = metadata.get(T.TOKEN_TYPE)
    if metadata.get(T.MODEL) == "llama" and types is not None:
        for i, ty in enumerate(types):
            if ty == TokenType.BYTE and not _BYTE_TOKEN.fullmatch(tokens[i]):
                raise bad(path, T.LIST, "byte tokens spelled <0xXX>", f"{tokens[i]!r:.40} (token {i}, type BYTE)")
    merges = metadata.get(T.MERGES)
    pairs = _check_merges(path, _strings(path, T.MERGES, merges), tokens) if merges is not None else None
    _check_scalars(metadata, path, n)
    return pairs


def _check_per_token(metadata: Mapping[str, Any], path: str, n: int) -> None:
    """Token types and scores: one valid value per token. The set-based test is the fast path; the
    element loop runs to find what to report (or to accept subclasses the fast path does not know)."""
    checks = ((T.TOKEN_TYPE, lambda vs: set(map(type, vs)) <= {int} and set(vs) <= _TYPES,
               lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 6, "token types 0..6"),
              (T.SCORES, lambda vs: set(map(type, vs)) <= {int, float} and not any(map(math.isnan, vs)),
               lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v, "numbers"))
    for key, fast, ok, what in checks:
        values = metadata.get(key)
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) != n:
            raise bad(path, key, f"an array of {n} {what} (one per token)",
                      f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__)
        if not fast(values):
            i = next((i for i, v in enumerate(values) if not ok(v)), None)
            if i is not None:
                raise bad(path, key, what, f"{values[i]!r:.40} at index {i}")


def _check_merges(path: str, merges: Sequence[str], tokens: Sequence[str]) -> list[tuple[str, ...]]:
    vocab = set(tokens)
    pairs = merge_pairs(merges)
    if set(map(len, pairs)) <= {2}:
        lefts, rights = list(map(itemgetter(0), pairs)), list(map(itemgetter(1), pairs))
        if vocab.issuperset(lefts) and vocab.issuperset(rights) and vocab.issuperset(map(str.__add__, lefts, rights)) \
                and "" not in vocab:
            return pairs
    for i, m in enumerate(merges):
        left, right = split_merge(m)
        if not (left and right and left in vocab and right in vocab and left + right in vocab):
            raise bad(path, T.MERGES, "'LEFT RIGHT' pairs of tokens whose join is a token",
                      f"{m!r:.60} at index {i}")
    return pairs


def _check_scalars(metadata: Mapping[str, Any], path: str, n: int) -> None:
    for name in _SPECIAL_IDS:
        key = getattr(T, name, None)
        value = metadata.get(key) if key else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n):
            raise bad(path, key, f"a token id in [0, {n})", f"{value!r:.40}")
    for name in _FLAGS:
        value = metadata.get(getattr(T, name))
        if value is not None and not isinstance(value, bool):
            raise bad(path, getattr(T, name), "a bool", f"{value!r:.40}")
    for key in (T.PRE, T.MODEL):
        value = metadata.get(key)
        if value is not None and not isinstance(value, str):
            raise bad(path, key, "a string", f"{value!r:.40}")
