"""SentencePiece-style (byte-fallback BPE) tokenizers become GGUF tokenizer model `llama`."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import Keys

from converters import convert
from fixtures import SPECS, build_model, save_checkpoint, train_llama_bpe
from readback import field

SPM_TRICKY = ["Hello world", " leading space", "  two  spaces", "tab\there", "line\nbreak", "naïve café",
              "日本語 emoji 🦙", "numbers 3 33 333", "I've been 'told'", "<s>inline special</s> text"]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    tok = train_llama_bpe()
    spec = SPECS["mixtral"]
    model = build_model(spec, tok)
    folder = save_checkpoint(model, spec, tok, tmp_path_factory.mktemp("spm") / "ckpt", fused=True)
    out = folder.parent / "spm.gguf"
    convert(folder, out, name="tiny")
    return tok, out


def test_llama_tokenizer_metadata(spm):
    tok, out = spm
    reader = gguf.GGUFReader(out)
    assert field(reader, Keys.Tokenizer.MODEL) == "llama"
    types = field(reader, Keys.Tokenizer.TOKEN_TYPE)
    scores = np.array(field(reader, Keys.Tokenizer.SCORES))
    assert all(types[3 + b] == gguf.TokenType.BYTE for b in range(256))
    assert types[tok.token_to_id("<s>")] == gguf.TokenType.CONTROL
    # Scores replay the merge order: a token made by an earlier merge scores higher.
    assert scores[:259].max() == 0 and scores[259:].min() < 0


@pytest.mark.interop
def test_llama_cpp_tokenizes_like_source(spm):
    llama_cpp = pytest.importorskip("llama_cpp")
    tok, out = spm
    llm = llama_cpp.Llama(str(out), vocab_only=True, verbose=False)
    try:
        for text in SPM_TRICKY:
            want = tok.encode(text).ids
            got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            assert got == want, f"{text!r}: llama.cpp {got} != source {want}"
    finally:
        llm.close()
