"""End of generation as llama.cpp's vocabulary loader decides it: the file's EOS/EOT/EOM ids, the
tokens it reads as such by their text, its FIM tokens, and its two exceptions (harmony's <|end|>,
Gemma 4's </s>). Small byte-level vocabularies built here; llama.cpp's own answer on its test
vocabularies when llama-cpp-python is installed (with random texts through both tokenizers)."""
from __future__ import annotations

import random

import pytest
from gguf.constants import TokenType

from strata.gguf.header import scan_header
from strata.tokenizer import KINDS, Tokenizer
from tests.tokenizer import llama_cpp_ref
from tests.tokenizer.fixtures import T, byte_level_metadata
from tests.tokenizer.vocab_vectors import vocab_dir

metadata = byte_level_metadata


def ids(tok: Tokenizer, *texts: str) -> set[int]:
    return {tok.tokens.index(t) for t in texts}


def test_eos_eot_eom_ids_and_eog_texts():
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eom_id|>", "<end_of_turn>", "<my_stop>", "<my_eom>"]
    meta = metadata(specials, eos_token_id=257 + 2, eot_token_id=257 + 5, eom_token_id=257 + 6)
    tok = Tokenizer.from_metadata(meta, "eog.gguf")
    assert tok.eog_ids == ids(tok, "<|endoftext|>", "<my_stop>", "<my_eom>", "<|im_end|>", "<|eom_id|>",
                              "<end_of_turn>")
    assert tok.special.eot == 257 + 5 and tok.special.eom == 257 + 6
    assert 257 + 0 not in tok.eog_ids  # <|im_start|> opens a turn


def test_eot_and_eom_found_by_text_when_the_file_names_none():
    tok = Tokenizer.from_metadata(metadata(["<|eot_id|>", "<|eom_id|>", "<|begin_of_text|>"]), "eog.gguf")
    assert tok.eog_ids == ids(tok, "<|eot_id|>", "<|eom_id|>")


def test_text_eog_tokens_become_control():
    meta = metadata(["<|im_end|>"])
    meta[T + "token_type"][-1] = TokenType.NORMAL  # a converter that forgot to mark it
    tok = Tokenizer.from_metadata(meta, "eog.gguf")
    assert tok.types[-1] == TokenType.CONTROL and tok.is_special(257 + 0)
    assert tok.encode("<|im_end|>", add_special=False) == [257 + 0]
    assert 257 + 0 not in tok.encode("<|im_end|>", add_special=False, parse_special=False)


def test_fim_pad_repo_and_file_separator_end_generation():
    tok = Tokenizer.from_metadata(metadata(["<|fim_prefix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]), "x")
    assert tok.eog_ids == ids(tok, "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


def test_deepseek_end_of_sentence_and_kimi_eot():
    eos = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    tok = Tokenizer.from_metadata(metadata([eos, "[EOT]", "[EOS]", "<\uff5cbegin\u2581of\u2581sentence\uff5c>"]), "x")
    assert tok.eog_ids == ids(tok, eos, "[EOT]", "[EOS]")


def test_harmony_end_is_not_the_end_when_return_and_call_exist():
    names = ["<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>", "<|message|>"]
    tok = Tokenizer.from_metadata(metadata(names, eos_token_id=257 + 2), "gpt-oss.gguf")
    assert tok.eog_ids == ids(tok, "<|return|>", "<|call|>")
    shown = ids(tok, "<|end|>", "<|start|>", "<|channel|>", "<|message|>")
    assert all(tok.types[i] == TokenType.USER_DEFINED for i in shown)  # rendered as text, as in llama.cpp
    alone = Tokenizer.from_metadata(metadata(["<|end|>", "<|user|>"]), "phi.gguf")
    assert alone.eog_ids == ids(alone, "<|end|>")


def test_end_of_sentence_is_plain_text_beside_gemma4_tool_response():
    tok = Tokenizer.from_metadata(metadata(["<eos>", "</s>", "<|tool_response>", "<turn|>"], eos_token_id=257), "g")
    assert tok.eog_ids == ids(tok, "<eos>", "<|tool_response>", "<turn|>")
    assert tok.types[tok.tokens.index("</s>")] == TokenType.NORMAL


def test_sentencepiece_eos_defaults_to_2():
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581a"]
    meta = {T + "model": "llama", T + "tokens": tokens, T + "scores": [0.0] * len(tokens),
            T + "token_type": [2, 3, 3, *[6] * 256, 1]}
    assert Tokenizer.from_metadata(meta, "spm.gguf").eog_ids == {2}


# -- llama.cpp's own answer ----------------------------------------------------------------------

MODELS = vocab_dir()
ALL_VOCABS = sorted(MODELS.glob("ggml-vocab-*.gguf")) if MODELS is not None else []
#: Pieces of text that stress the split rules: scripts, digits of several kinds, spaces that are
#: not ' ', contractions, emoji with joiners, combining marks, special-token texts.
PIECES = [*"aAbBzZ éÉßſKΩ日本語中文한국어ひらカタ 0123456789١٢٣²½ \n\n\r\t  \u00a0\u3000\u2003",
          *".,;:!?'\"-_/\\()[]{}<>|~`@#$%^&*+=…。，、",
          "'s", "'LL", "don't", "🦙", "😶\u200d🌫️", "\u0301", "e\u0301", "Привет", "Ελληνικά",
          "<|endoftext|>", "<s>", "</s>",
          "IMGIMGABZ", "    ", "\t\t", "1234567"]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 25))) for _ in range(n)]


@pytest.mark.skipif(MODELS is None, reason="llama.cpp's source tree not found (set STRATA_LLAMA_CPP_SRC, or let the suite fetch it)")
@pytest.mark.parametrize("vocab", ALL_VOCABS, ids=lambda p: p.name[len("ggml-vocab-"):-len(".gguf")])
def test_eog_ids_and_random_text_equal_llama_cpp(vocab):
    """Every vocabulary llama.cpp ships (with vectors or not): the end-of-generation set, and the ids
    of 200 random texts, against llama.cpp itself."""
    meta = scan_header(vocab).metadata
    if meta["tokenizer.ggml.model"] not in KINDS:
        pytest.skip(f"{vocab.name}: tokenizer kind {meta['tokenizer.ggml.model']!r} is refused by Strata")
    tok = Tokenizer.from_metadata(meta, str(vocab))
    assert tok.eog_ids == llama_cpp_ref.eog_ids(vocab)
    texts = random_texts(200)
    expected = llama_cpp_ref.tokenize(vocab, texts)
    wrong = [f"{t!r:.60}: expected {e[:16]}, got {g[:16]}" for t, e in zip(texts, expected)
             if (g := tok.encode(t, add_special=False, parse_special=False)) != e]
    assert not wrong, f"{vocab.name}: {len(wrong)} of {len(texts)} texts differ:\n" + "\n".join(wrong[:10])
