"""Strata's tokenizer against llama.cpp's own test vectors: every `ggml-vocab-*.gguf` that has
`.inp`/`.out` files, every input exact (ids as test-tokenizer-0 produces them: no BOS/EOS, special
text not parsed). Needs llama.cpp's source tree ($STRATA_LLAMA_CPP_SRC, else the one the suite fetches)."""
from __future__ import annotations

import pytest

from strata.gguf.header import scan_header
from strata.tokenizer import KINDS, Tokenizer
from tests.tokenizer import llama_cpp_ref
from tests.tokenizer.vocab_vectors import vectors, vocab_dir, vocab_files

MODELS = vocab_dir()
pytestmark = pytest.mark.skipif(MODELS is None, reason="llama.cpp's source tree not found (set STRATA_LLAMA_CPP_SRC, or let the suite fetch it)")
VOCABS = vocab_files(MODELS) if MODELS is not None else []


def test_vocabularies_are_there():
    assert len(VOCABS) >= 15, f"{MODELS}: expected llama.cpp's test vocabularies with vectors, found {len(VOCABS)}"


@pytest.mark.parametrize("vocab", VOCABS, ids=lambda p: p.name[len("ggml-vocab-"):-len(".gguf")])
def test_encode_matches_llama_cpp(vocab):
    tok = Tokenizer.from_metadata(scan_header(vocab).metadata, str(vocab))
    wrong = []
    for text, ids in vectors(vocab):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != ids:
            wrong.append(f"{text!r:.60}: expected {ids[:16]}, got {got[:16]}")
    assert not wrong, f"{vocab.name}: {len(wrong)} inputs differ:\n" + "\n".join(wrong)


SAME_INPUTS = sorted(p for p in MODELS.glob("ggml-vocab-*.gguf") if p not in VOCABS) if MODELS is not None else []


@pytest.mark.parametrize("vocab", SAME_INPUTS, ids=lambda p: p.name[len("ggml-vocab-"):-len(".gguf")])
def test_vocabularies_without_vectors_match_llama_cpp(vocab):
    """The vocabularies llama.cpp ships without vectors, on the inputs the others are tested with,
    against llama.cpp itself (llama-cpp-python)."""
    meta = scan_header(vocab).metadata
    if meta["tokenizer.ggml.model"] not in KINDS:
        pytest.skip(f"{vocab.name}: tokenizer kind {meta['tokenizer.ggml.model']!r} is refused by Strata")
    texts = [text for text, _ in vectors(VOCABS[0])] + ["<s>x</s> <|endoftext|>", "  \t\u00a0tabs\r\n"]
    tok = Tokenizer.from_metadata(meta, str(vocab))
    expected = llama_cpp_ref.tokenize(vocab, texts)
    wrong = [f"{t!r:.60}: expected {e[:16]}, got {g[:16]}" for t, e in zip(texts, expected)
             if (g := tok.encode(t, add_special=False, parse_special=False)) != e]
    assert not wrong, f"{vocab.name}: {len(wrong)} inputs differ:\n" + "\n".join(wrong)
