"""Tokenizers of synthetic checkpoints: special tokens, chat template, corpora, BPE trainers.

Every synthetic checkpoint (the demo's, the tests', the benchmarks') uses these special tokens and
this ChatML template, so a fact about them is stated once. Tokenizers are trained on the spot
(nothing is downloaded); they are test data, not something the engine reads.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from strata.tokenizer import GPT2_REGEX, LLAMA3_REGEX, QWEN2_REGEX, bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS, PAD = "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STYLE_REGEX = {"gpt2": GPT2_REGEX, "llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX}

# The demo's words: plain lower-case pieces, so a random model prints something word-like.
_DEMO_WORDS = ("the a of to in is it and that expert router token layer memory model cache disk host device "
               "slot page prefetch hot cold warm quantize block scale fast slow read write moves waits runs").split()
# The tests' words, with strings that stress pre-tokenizers (accents, CJK, emoji, code, digits).
_WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
          "word but not what all were we when your can said there use an each which she do how their if will up "
          "other about out many then them these so some her would make like him into time has look two more write "
          "go see number no way could people my than first water been call who oil its now find long down day did "
          "get come made may part expert router token layer memory model quantize block scale cache").split()
_EXTRA = ["naïve café über straße", "日本語のテキスト", "中文字符测试", "emoji 🦙🚀😀 ✅", "x = f(a, b) + 3.14;",
          "\tindented\n", "    four spaces", "I've you'll he's we'd they're", "1234567890", "!!! ??? ... ---",
          "Привет мир", "ελληνικά", "<tag attr=\"v\">"]


def word_corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    """Short sentences of the demo's plain words."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_DEMO_WORDS) for _ in range(rng.randint(4, 12))) + rng.choice([".", ",", "!", "?"])
            for _ in range(n_lines)]


def corpus(n_lines: int = 3000, seed: int = 0) -> list[str]:
    """Lines of words mixed with non-ASCII text, code, digits and odd whitespace."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), rng.choice(_EXTRA))
        if rng.random() < 0.2:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 10**rng.randint(1, 6))))
        lines.append(" ".join(words) + rng.choice(["", ".", "\n", "\n\n", "  "]))
    return lines


def train_byte_bpe(style: str, vocab_size: int = 600, lines: list[str] | None = None):
    """A byte-level BPE `tokenizers.Tokenizer` with the pre-tokenizer of `style` ('gpt2', 'llama3',
    'qwen2') and SPECIALS as ids 0-2, trained on `lines` (default: `corpus()`)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(STYLE_REGEX[style]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus() if lines is None else lines, trainer)
    return tok


def tokenizer_config(chat_template: bool = True) -> dict:
    """tokenizer_config.json of a synthetic checkpoint (the template inline when `chat_template`)."""
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS, "pad_token": PAD,
           "add_bos_token": False, "add_eos_token": False, "model_max_length": 4096}
    if chat_template:
        cfg["chat_template"] = CHAT_TEMPLATE
    return cfg


def save_tokenizer(tok, folder: Path, chat_template_file: bool = False) -> None:
    """tokenizer.json and tokenizer_config.json; the chat template inline in the config, or in
    chat_template.jinja (as transformers 5 saves it) when `chat_template_file`."""
    tok.save(str(folder / "tokenizer.json"))
    if chat_template_file:
        (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(not chat_template_file), indent=1),
                                                  encoding="utf-8")


def byte_tokenizer_json(vocab_size: int) -> dict:
    """tokenizer.json of a byte-level BPE with no merges: the 256 byte symbols, SPECIALS, then
    reserved special tokens up to `vocab_size` (for checkpoints whose text does not matter)."""
    alphabet = [bytes_to_unicode()[b] for b in range(256)]
    names = SPECIALS + [f"<|special_{i}|>" for i in range(256 + len(SPECIALS), vocab_size)]
    added = [{"id": 256 + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, name in enumerate(names)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": byte_level,
            "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {c: i for i, c in enumerate(alphabet)}, "merges": []}}
