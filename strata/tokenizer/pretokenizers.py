"""Byte-level BPE pre-tokenizers: llama.cpp's `tokenizer.ggml.pre` names and what each one does.

llama.cpp splits text with a list of regexes applied in turn: each one cuts every piece left by
the one before into its matches and the stretches between them (both kept). That is a Sequence of
`Split(..., behavior="isolated")` in `tokenizers`. The regexes below are llama.cpp's spellings,
adjusted where its engine and Oniguruma (the one `tokenizers` uses) read the same text apart:

* llama.cpp maps every \\p{..} class to its own letter/number/punctuation/mark/symbol table, so
  \\p{Lu} means any letter there; its patterns already spell case with `[^a-z]`/`[^A-Z]`
  lookaheads, and contractions as `'[sS]` (Oniguruma's `(?i:'s)` would also take `'ſ`).
* llama.cpp's regexes see every non-ASCII space as U+000B, so a class naming U+3000 or a range
  over U+2000 never matches those spaces: such classes are intersected with \\S here.
* ECMAScript's `$` is the end of the piece (Oniguruma's is any line end: `\\z` here) and its `\\d`
  is ASCII (Oniguruma's is any digit: `[0-9]` here).
* The patterns llama.cpp runs by hand-written code rather than a regex engine get a regex that
  splits the same way: Kimi-K2's (Han runs by llama.cpp's own Han ranges, then any other letter
  run: no case distinction), AFMoE's and Tiny-Aya's digit grouping (the first group of a number
  keeps the non-digits before it, as its code does), SuperBPE's groups of three from the right.

`PRE_TOKENIZERS` maps every name llama.cpp accepts to its `PreTokenizer`.
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

#: The split regexes as Hugging Face tokenizer.json files spell them (the converter's table).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_WS_TAIL = r"|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
_QWEN2 = _CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
# Upper-then-lower and lower-only letter runs, as llama.cpp spells them (tekken, gpt-4o).
_UPPER, _LOWER = r"(?:(?=[\p{L}])[^a-z])", r"(?:(?=[\p{L}])[^A-Z])"


def _cased_words(suffix: str) -> str:
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}"


_UPPER_M, _LOWER_M = r"(?:(?=[\p{L}\p{M}])[^a-z])", r"(?:(?=[\p{L}\p{M}])[^A-Z])"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_PUNCT_WORD = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
_DEEPSEEK_LETTERS = (  # the letters of several alphabets (Latin, Greek, Cyrillic, Armenian, ...), as listed
    "[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
    "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]")
_DEEPSEEK_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff&&\\S]+"
# llama.cpp's Han ranges (unicode_cpt_is_han): CJK unified ideographs and extensions A-F, the
# compatibility ideographs; narrower than \p{Han}, which also holds radicals and 〆〇.
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df\U0002a700-\U0002ebef\U0002f800-\U0002fa1f"
_KIMI = (rf"[{_HAN}]+|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}&&[^{_HAN}]]+{_CONTRACTION}?|\p{{N}}{{1,3}}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL)
# A number's digits in groups of three from the right, the first group (1-3 digits) taking the
# non-digits before it along (llama.cpp's hand-written AFMoE split does so).
_DIGITS_FROM_RIGHT = r"\P{N}*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
_LINES = r"[^\n]+|\n+"
_NOT_SENTENCE_END = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

#: llama.cpp's pre-tokenizer types (LLAMA_VOCAB_PRE_TYPE_*) -> their split regexes, in order.
SPLITS: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "jais2": (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
              + r"|\s{1,2}(?!\S)|\s{1}",),
    "deepseek-llm": (r"[\r\n]", r"\s?" + _DEEPSEEK_LETTERS + "+",
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002&&\\S]+", r"\s+\z",
                     _DEEPSEEK_CJK, r"\p{N}+"),
    "deepseek3": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*" + _WS_TAIL),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORD + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
              "\ufe30-\ufe4f]+|[\u3105-\u312f]+|" + _CJK_KANA,
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION + "?"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION + "?"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*" + _WS_TAIL,),
    "bloom": (_NOT_SENTENCE_END,),
    "chatglm4": (_LLAMA3,),
    "viking": (_NOT_SENTENCE_END, r"\p{N}"),
    "tekken": (_cased_words("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL,),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", _GPT2),
    "gpt4o": (_cased_words(_CONTRACTION + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL,),
    "granite-emb-multi": (
        rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}*{_LOWER_M}+{_CONTRACTION}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_M}+{_LOWER_M}*"
        rf"{_CONTRACTION}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*" + _WS_TAIL,),
    "tiny-aya": (_DIGITS_FROM_RIGHT,
                 r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION + "?"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION + "?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL),
    "kimi-k2": (_KIMI,),
    "superbpe": (r"\p{N}+", r"(?=(?:[0-9]{3})+(?![0-9]))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+" + _WS_TAIL,),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL,),
    "afmoe": (_DIGITS_FROM_RIGHT, "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
              "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff"
              "\uac00-\ud7af\u1100-\u11ff]+",
              _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*" + _WS_TAIL),
    "laguna": (_LINES, _QWEN2),
    "exaone-moe": (_CONTRACTION + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "gemma4": (_LINES,),
    "minicpm5": (r"\p{N}{1,3}",
                 _CONTRACTION + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL),
    "whitespace": (r"\S+",),
}


@dataclass(frozen=True)
class PreTokenizer:
    """What one `tokenizer.ggml.pre` name stands for in llama.cpp."""

    splits: tuple[str, ...]  # regexes applied in turn
    ignore_merges: bool = False  # a pre-token found whole in the vocabulary is one token
    byte_level: bool = True  # bytes mapped to GPT-2's printable characters; else raw UTF-8, <0xXX> fallback
    escape_spaces: bool = False  # ' ' -> U+2581 before splitting (SentencePiece-style BPE)
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token
    always_bos: bool = False  # BOS whatever the file says (llama.cpp's override for Gemma 4)
    whole_newlines: bool = False  # a run of newlines that is a token is that token (Gemma 4)


def _pre(kind: str, **flags) -> PreTokenizer:
    raw = kind in ("gemma4", "whitespace")
    return PreTokenizer(SPLITS[kind], byte_level=not raw, escape_spaces=kind == "gemma4", **flags)


_LLAMA3_NAMES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                 "jina-v5-nano")
_BY_KIND: dict[str, tuple[str, ...]] = {
    "default": ("default",), "deepseek-llm": ("deepseek-llm",), "deepseek-coder": ("deepseek-coder",),
    "deepseek3": ("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), "spark2_5": ("spark2_5",),
    "falcon": ("falcon",), "jais2": ("jais-2",),
    "starcoder": ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
    "gpt2": ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
             "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo", "jais",
             "trillion", "granite-docling"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
    "qwen35": ("qwen35",), "llama3": ("dbrx", "smaug-bpe"), "bloom": ("poro-chat", "bloom", "gpt3-finnish"),
    "chatglm4": ("chatglm-bpe",), "viking": ("viking",), "gemma4": ("gemma4", "granite-embed-multi-311m", "sarvam-moe"),
    "gpt4o": ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "tiny-aya": ("tiny_aya", "cohere2moe"),
    "superbpe": ("superbpe",), "bailingmoe": ("bailingmoe", "bailingmoe2", "llada-moe"), "seed-coder": ("seed-coder",),
    "kimi-k2": ("kimi-k2",), "ufakzeka": ("ufakzeka",), "grok-2": (), "afmoe": ("afmoe",), "laguna": ("laguna",),
    "exaone-moe": ("exaone-moe",), "whitespace": ("whitespace",),
}

#: Every `tokenizer.ggml.pre` name llama.cpp accepts for a BPE vocabulary -> what it does.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **{name: _pre(kind) for kind, names in _BY_KIND.items() for name in names},
    "grok-2": _pre("qwen2"),
    **{name: _pre("llama3", ignore_merges=True, add_bos=True) for name in _LLAMA3_NAMES},
    **{name: _pre("chatglm4", ignore_merges=True) for name in ("glm4", "glm5")},
    "tekken": _pre("tekken", ignore_merges=True, add_bos=True),
    "chameleon": _pre("chameleon", add_bos=True),
    "youtu": _pre("youtu", ignore_merges=True),
    "minicpm5": _pre("minicpm5", ignore_merges=True),
    "granite-embed-multi-97m": _pre("granite-emb-multi", ignore_merges=True),
    **{name: _pre("gemma4", add_bos=True, always_bos=True, whole_newlines=True)
       for name in ("gemma4", "granite-embed-multi-311m")},
}
#: name -> split regexes (the shape older callers know).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {name: pre.splits for name, pre in PRE_TOKENIZERS.items()}


def hf_pre_tokenizer(pre: PreTokenizer) -> pre_tokenizers.PreTokenizer:
    """The `tokenizers` pre-tokenizer doing what llama.cpp does for `pre`."""
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.splits]
    if pre.byte_level:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


__all__ = ["GPT2_REGEX", "LLAMA3_REGEX", "PRE_TOKENIZERS", "PRE_TOKENIZER_REGEXES", "PreTokenizer", "QWEN2_REGEX",
           "SPLITS", "hf_pre_tokenizer"]
