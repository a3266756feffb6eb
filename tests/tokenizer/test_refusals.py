"""Vocabulary metadata Strata cannot use is refused at load with one line that names the file, the
key, what was expected and what was found; an unknown pre-tokenizer also says what to do."""
from __future__ import annotations

import pytest

from strata.errors import StrataFormatError
from strata.tokenizer import PRE_TOKENIZERS, Tokenizer
from tests.tokenizer.fixtures import T, byte_level_metadata


def refusal(meta: dict) -> str:
    with pytest.raises(StrataFormatError) as e:
        Tokenizer.from_metadata(meta, "vocab.gguf")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("vocab.gguf: "), msg
    return msg


def test_unknown_pre_tokenizer_names_itself_the_known_ones_and_what_to_do():
    msg = refusal(byte_level_metadata(pre="qwen9"))
    assert "'qwen9'" in msg and repr(T + "pre") in msg and "report" in msg
    assert all(name in msg for name in ("deepseek-v3", "kimi-k2", "qwen35", "gpt-4o", "tekken"))


@pytest.mark.parametrize("name", sorted(n for n, pre in PRE_TOKENIZERS.items() if pre.byte_level))
def test_every_byte_level_pre_tokenizer_builds_and_round_trips(name):
    tok = Tokenizer.from_metadata(byte_level_metadata(pre=name), "vocab.gguf")
    text = "ab Ab\n\n 12345 日本 don't\u3000x"
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text and 256 in ids  # 'ab' merged where it stands alone


@pytest.mark.parametrize("kind", ["rwkv", "t5", "plamo2", "no_vocab"])
def test_unsupported_kinds_are_refused_by_name(kind):
    msg = refusal(byte_level_metadata(**{"model": kind}))
    assert repr(kind) in msg and "gpt2" in msg and "llama" in msg


@pytest.mark.parametrize("key, value, found", [
    ("token_type", [1] * 10, "10 values"),
    ("scores", [0.0] * 300, "300 values"),
    ("merges", ["a b", "a zz"], "'a zz' at index 1"),  # 'zz' is no token
    ("merges", ["a b", "b a"], "'b a' at index 1"),  # 'ba' is no token
    ("merges", ["ab"], "'ab' at index 0"),  # no space
    ("merges", ["ab "], "'ab ' at index 0"),  # an empty right side
    ("eom_token_id", 10_000, "10000"),
    ("eot_token_id", -1, "-1"),
])
def test_malformed_vocabularies_are_one_line_errors(key, value, found):
    msg = refusal(byte_level_metadata(**{key: value}))
    assert repr(T + key) in msg and "expected" in msg and found in msg, msg


def test_merges_missing_from_a_bpe_vocabulary():
    meta = byte_level_metadata()
    del meta[T + "merges"]
    assert repr(T + "merges") in refusal(meta)
