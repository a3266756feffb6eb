"""Strata's tokenizer against llama.cpp's own test vectors: every `ggml-vocab-*.gguf` that has
`.inp`/`.out` files, every input exact (ids as test-tokenizer-0 produces them: no BOS/EOS, special
text not parsed). Needs llama.cpp's source tree: $STRATA_LLAMA_CPP_SRC (CI sets it)."""
from __future__ import annotations

import pytest

from strata.gguf.header import scan_header
from strata.tokenizer import Tokenizer
from tests.tokenizer.vocab_vectors import vectors, vocab_dir, vocab_files

MODELS = vocab_dir()
pytestmark = pytest.mark.skipif(MODELS is None, reason="llama.cpp's source tree: set STRATA_LLAMA_CPP_SRC")
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
