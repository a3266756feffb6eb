"""The `tokenizers` pipeline for each vocabulary kind llama.cpp reads (`tokenizer.ggml.model`):

* `gpt2`: BPE over the vocabulary and merges; the pre-tokenizer named by `tokenizer.ggml.pre`
  (pretokenizers.py) splits the text and, for byte-level vocabularies, maps bytes to GPT-2's
  printable characters. `gemma4` is BPE on raw UTF-8 with spaces written U+2581 and <0xXX> byte
  tokens for what the merges do not cover.
* `llama`: SentencePiece. Spaces become U+2581, a space is prefixed to every text run (llama.cpp's
  `add_space_prefix`, after special tokens too), pieces merge highest score first, which is BPE
  with merges ranked by the score of the merged piece; unknown bytes fall back to <0xXX> tokens.
* `bert`: WordPiece. Lower-cased, accents stripped, split at spaces, punctuation and CJK ideographs;
  each word matched greedily, longest piece first; a word that cannot be matched is [UNK]. The file
  spells word-initial pieces with a U+2581 prefix and continuations bare; `tokenizers` wants
  word-initial bare and continuations prefixed with `##`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from gguf.constants import Keys, TokenType
from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from strata.errors import StrataFormatError

from .pretokenizers import PRE_TOKENIZERS, PreTokenizer, hf_pre_tokenizer

T = Keys.Tokenizer
SPM_SPACE = "\u2581"


def vocab_ids(tokens: Sequence[str]) -> dict[str, int]:
    """Text -> id; a repeated (padding) text keeps its first id (built backwards: the first write wins
    by coming last)."""
    return dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1)))


def pre_tokenizer(metadata: Mapping[str, Any], path: str) -> PreTokenizer:
    """The pre-tokenizer a BPE vocabulary names; missing means 'default', as in llama.cpp."""
    if metadata.get(T.MODEL) == "gemma4":
        return PRE_TOKENIZERS["gemma4"]
    name = metadata.get(T.PRE) or "default"
    if name not in PRE_TOKENIZERS:
        raise StrataFormatError(
            f"{path}: metadata key {T.PRE!r}: unknown pre-tokenizer {name!r}; expected one of llama.cpp's names "
            f"({', '.join(sorted(PRE_TOKENIZERS))}); if llama.cpp runs this file, please report the name to Strata")
    return PRE_TOKENIZERS[name]


def bpe(metadata: Mapping[str, Any], tokens: Sequence[str], merges: list[tuple[str, ...]] | None, pre: PreTokenizer,
        path: str) -> HFTokenizer:
    """`merges`: the file's merges as checked token pairs."""
    if merges is None:
        raise StrataFormatError(f"{path}: metadata key {T.MERGES!r}: expected the BPE merges of a "
                                f"{metadata.get(T.MODEL)!r} tokenizer, found no such key")
    hf = HFTokenizer(models.BPE(vocab_ids(tokens), merges, ignore_merges=pre.ignore_merges,
                                byte_fallback=not pre.byte_level))
    if pre.escape_spaces:
        hf.normalizer = normalizers.Replace(" ", SPM_SPACE)
    hf.pre_tokenizer = hf_pre_tokenizer(pre)
    hf.decoder = decoders.ByteLevel() if pre.byte_level else decoders.Sequence(
        [decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def newline_runs(tokens: Sequence[str]) -> list[str]:
    """Tokens made of newlines only. llama.cpp takes a run of newlines whole when it is a token
    (Gemma 4); matched as added tokens, a run longer than the longest such token is cut at it
    (llama.cpp would merge it by the merges: no vocabulary here has one that long)."""
    return [t for t in tokens if t and not t.strip("\n")]


def sentencepiece(metadata: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int], unk: int | None,
                  path: str) -> HFTokenizer:
    scores = metadata.get(T.SCORES)
    if scores is None:
        raise StrataFormatError(f"{path}: metadata key {T.SCORES!r}: expected the piece scores of a "
                                "'llama' tokenizer, found no such key")
    vocab = vocab_ids(tokens)
    merges = []  # (score of the merged piece, its id, left, right): highest score first, as SentencePiece
    for i, piece in enumerate(tokens):
        if types[i] != TokenType.NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[i], i, left, right))
    merges.sort()
    hf = HFTokenizer(models.BPE(vocab, [(a, b) for _, _, a, b in merges], unk_token=tokens[unk] if unk is not None
                                else None, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", SPM_SPACE)]
    if metadata.get(T.ADD_PREFIX, True):
        steps.insert(0, normalizers.Prepend(SPM_SPACE))
    hf.normalizer = normalizers.Sequence(steps)
    hf.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return hf


def wordpiece(metadata: Mapping[str, Any], tokens: Sequence[str], unk: int | None, path: str) -> HFTokenizer:
    if unk is None:
        raise StrataFormatError(f"{path}: metadata key {T.UNK_ID!r}: expected the [UNK] token of a 'bert' "
                                "tokenizer, found none")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        key = t[1:] if t.startswith(SPM_SPACE) else "##" + t
        if key and key != "##":
            vocab.setdefault(key, i)
    vocab.setdefault(tokens[unk], unk)
    lower = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(metadata.get("tokenizer.ggml.normalizer.strip_accents", lower))
    hf = HFTokenizer(models.WordPiece(vocab, unk_token=tokens[unk], continuing_subword_prefix="##",
                                      max_input_chars_per_word=1 << 30))
    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=lower)
    # llama.cpp keeps only the first code point of a decomposed character: every mark goes (not only
    # Mn), and so do a Hangul syllable's vowel and final consonant.
    hf.normalizer = normalizers.Sequence([bert, normalizers.Replace(Regex(r"[\p{M}\u1160-\u11ff]"), "")]) if strip \
        else bert
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    return hf


def add_special_tokens(hf: HFTokenizer, tokens: Sequence[str], types: Sequence[int],
                       extra: Sequence[str] = ()) -> None:
    """CONTROL tokens are matched in text only when special text is parsed; USER_DEFINED ones (and
    `extra`) always, before pre-tokenization, as llama.cpp does."""
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, ty in enumerate(types) if ty == TokenType.CONTROL]
    plain = [AddedToken(tokens[i], special=False, normalized=False)
             for i, ty in enumerate(types) if ty == TokenType.USER_DEFINED]
    hf.add_special_tokens(special)
    hf.add_tokens(plain + [AddedToken(t, special=False, normalized=False) for t in extra])


__all__ = ["SPM_SPACE", "add_special_tokens", "bpe", "newline_runs", "pre_tokenizer", "sentencepiece", "vocab_ids",
           "wordpiece"]
