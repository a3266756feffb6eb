"""Tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) from a checkpoint folder.

Two families, as llama.cpp reads them:
  * byte-level BPE (`tokenizer.json`, BPE model without byte fallback, ByteLevel decoder) is
    written as model `gpt2` with merges and a pre-tokenizer name. llama.cpp's converter identifies
    the pre-tokenizer by hashing how the tokenizer splits a probe string, which cannot know a newly
    trained tokenizer; here it is identified by the split regex itself, which is what the name
    stands for in llama.cpp (each name selects one regex).
  * SentencePiece-style (`tokenizer.json` BPE with byte fallback, or `tokenizer.model`) is written
    as model `llama` with per-token scores; for a BPE vocabulary the score of a token is minus the
    rank of the merge that creates it, so llama.cpp's highest-score-first merging replays BPE.

Special token ids, add-bos/eos flags, merges and the chat template (tokenizer_config.json or
chat_template.jinja) come from gguf-py's `SpecialVocab`.

Must not run a checkpoint's own tokenizer code or download anything: it reads the folder's files.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import gguf

from converters.source import ConversionError
from strata.tokenizer import GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX

log = logging.getLogger("strata.convert")

#: Split regex (as tokenizer.json spells it) -> llama.cpp pre-tokenizer name.
PRE_TOKENIZERS = {GPT2_REGEX: "gpt-2", LLAMA3_REGEX: "llama-bpe", QWEN2_REGEX: "qwen2"}


def write_tokenizer(w: gguf.GGUFWriter, folder: Path, n_vocab: int, pre: str | None = None) -> None:
    """Add the tokenizer of `folder` to `w`; `n_vocab` is the model's embedding row count."""
    tj_path = folder / "tokenizer.json"
    tj = _load_json(tj_path) if tj_path.is_file() else None
    model = (tj or {}).get("model", {})
    if tj and model.get("type") == "BPE" and not model.get("byte_fallback"):
        _write_bpe(w, tj, tj_path, n_vocab, pre)
        load_merges = True
    elif tj and model.get("type") == "BPE":
        _write_llama_bpe(w, tj, tj_path, n_vocab)
        load_merges = False
    elif (folder / "tokenizer.model").is_file():
        _write_sentencepiece(w, folder, n_vocab)
        load_merges = False
    else:
        found = f"a {model.get('type')} tokenizer.json" if tj else "neither tokenizer.json nor tokenizer.model"
        raise ConversionError(f"{folder}: unsupported tokenizer ({found}); expected byte-level BPE or SentencePiece")
    special = gguf.SpecialVocab(folder, load_merges=load_merges, n_vocab=n_vocab)
    special.add_to_gguf(w, quiet=True)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: cannot read: {exc}") from None


def _added(tj: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(a["id"]): a for a in tj.get("added_tokens", [])}


def _vocab_table(tj: dict[str, Any], path: Path, n_vocab: int) -> tuple[list[str], dict[int, dict[str, Any]]]:
    """Token text by id (vocabulary plus added tokens, padded to `n_vocab`) and the added tokens."""
    by_id: dict[int, str] = {int(i): t for t, i in tj["model"]["vocab"].items()}
    added = _added(tj)
    by_id.update({i: a["content"] for i, a in added.items()})
    top = max(by_id) + 1 if by_id else 0
    if top > n_vocab:
        raise ConversionError(f"{path}: token id {top - 1} does not fit the model's vocab_size {n_vocab}")
    return [by_id.get(i, f"[PAD{i}]") for i in range(n_vocab)], added


def _token_type(i: int, text: str, added: dict[int, dict[str, Any]], known: bool) -> gguf.TokenType:
    if not known:
        return gguf.TokenType.UNUSED
    if i in added:
        return gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED
    return gguf.TokenType.NORMAL


def pre_tokenizer_name(tj: dict[str, Any], path: Path) -> str:
    """llama.cpp's pre-tokenizer name for the split regex(es) of a byte-level BPE tokenizer.json."""
    regexes = _split_regexes(tj.get("pre_tokenizer") or {})
    if len(regexes) == 1 and regexes[0] in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[regexes[0]]
    raise ConversionError(f"{path}: pre-tokenizer splits by {regexes or 'nothing'}, which matches no llama.cpp "
                          f"pre-tokenizer this converter knows ({', '.join(sorted(set(PRE_TOKENIZERS.values())))}); "
                          "pass --tokenizer-pre NAME to choose one")


def _split_regexes(pt: dict[str, Any]) -> list[str]:
    if pt.get("type") == "Sequence":
        return [r for sub in pt.get("pretokenizers", []) for r in _split_regexes(sub)]
    if pt.get("type") == "Split":
        pattern = pt.get("pattern", {})
        return [pattern["Regex"] if "Regex" in pattern else re.escape(pattern.get("String", ""))]
    if pt.get("type") == "ByteLevel" and pt.get("use_regex", True):
        return [GPT2_REGEX]
    return []


def _write_bpe(w: gguf.GGUFWriter, tj: dict[str, Any], path: Path, n_vocab: int, pre: str | None) -> None:
    if (tj.get("decoder") or {}).get("type") != "ByteLevel":
        raise ConversionError(f"{path}: BPE tokenizer without a ByteLevel decoder is not supported")
    tokens, added = _vocab_table(tj, path, n_vocab)
    known = set(int(i) for i in tj["model"]["vocab"].values()) | set(added)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or pre_tokenizer_name(tj, path))
    w.add_token_list(tokens)
    w.add_token_types([_token_type(i, t, added, i in known) for i, t in enumerate(tokens)])


def _write_llama_bpe(w: gguf.GGUFWriter, tj: dict[str, Any], path: Path, n_vocab: int) -> None:
    tokens, added = _vocab_table(tj, path, n_vocab)
    vocab = tj["model"]["vocab"]
    scores = [0.0] * n_vocab
    for rank, merge in enumerate(tj["model"].get("merges", [])):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        i = vocab.get(left + right)
        if i is not None and scores[i] == 0.0:
            scores[i] = -float(rank + 1)
    types = []
    for i, text in enumerate(tokens):
        if i not in added and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(_token_type(i, text, added, text in vocab or i in added))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)


def _write_sentencepiece(w: gguf.GGUFWriter, folder: Path, n_vocab: int) -> None:
    try:
        vocab = gguf.vocab.SentencePieceVocab(folder)
    except ImportError:
        raise ConversionError(f"{folder / 'tokenizer.model'}: reading it needs the sentencepiece package "
                              "(pip install sentencepiece), or provide tokenizer.json") from None
    texts, scores, types = [], [], []
    for text, score, toktype in vocab.all_tokens():
        texts.append(text)
        scores.append(score)
        types.append(toktype)
    if len(texts) > n_vocab:
        raise ConversionError(f"{folder / 'tokenizer.model'}: {len(texts)} tokens do not fit vocab_size {n_vocab}")
    for i in range(len(texts), n_vocab):
        texts.append(f"[PAD{i}]".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(texts)
    w.add_token_scores(scores)
    w.add_token_types(types)
