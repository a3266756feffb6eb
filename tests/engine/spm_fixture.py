"""A SentencePiece-style tokenizer (Llama's tokenizer.json form), built on the spot.

Llama-family `tokenizer.json` files are BPE with byte fallback over text whose spaces are U+2581
and which is prefixed with one, with merges that are every split of each vocabulary piece into
two pieces, ranked by the merged piece's score (how transformers converts a SentencePiece model).
Here the pieces and their order come from a BPE trained on the converter's corpus; the alphabet is
limited so that rare characters (CJK, emoji) fall back to <0xXX> byte tokens.

The tokenizer class is PreTrainedTokenizerFast, which runs tokenizer.json as written (a space is
prefixed to every text run, as SentencePiece and llama.cpp do). transformers 5's LlamaTokenizer
class would replace the normalizer with a Metaspace pre-tokenizer that prefixes no space to text
that already starts with one, nor after special tokens.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers

from tests.convert.fixtures import corpus

SPECIALS = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                 "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


def _pieces(vocab_size: int) -> list[str]:
    """Vocabulary pieces in merge order (most frequent merges first), no specials, no bytes."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, limit_alphabet=90, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    model = json.loads(tok.to_str())["model"]
    alphabet = [t for t in model["vocab"] if len(t) == 1]
    merged = ["".join(m if isinstance(m, list) else m.split(" ")) for m in model["merges"]]
    return alphabet + [m for i, m in enumerate(merged) if m not in merged[:i]]


def build_spm_tokenizer(folder: Path, vocab_size: int = 700) -> Tokenizer:
    """Write tokenizer.json and tokenizer_config.json of a Llama-style tokenizer into `folder`."""
    pieces = _pieces(vocab_size)
    tokens = SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + pieces
    vocab = {t: i for i, t in enumerate(tokens)}
    score = {p: -i for i, p in enumerate(pieces)}  # earlier piece = higher score
    merges = sorted(((score[p], vocab[p[:c]], vocab[p[c:]], p[:c], p[c:]) for p in pieces for c in range(1, len(p))
                     if p[:c] in vocab and p[c:] in vocab), key=lambda m: (-m[0], m[1], m[2]))
    tok = Tokenizer(models.BPE(vocab, [(a, b) for *_, a, b in merges], unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
           "add_bos_token": True, "add_eos_token": False, "chat_template": CHAT_TEMPLATE, "legacy": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return tok
