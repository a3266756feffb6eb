"""llama.cpp's own tokenizer through llama-cpp-python's C API, on a vocabulary-only load: the
reference for vocabularies without test vectors and for the end-of-generation set."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def llama_cpp_vocab(path: Path) -> Iterator[tuple[object, object]]:
    """(the llama_cpp module, the llama_vocab pointer) of `path`; skips without llama-cpp-python."""
    llama_cpp = pytest.importorskip("llama_cpp")
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp could not load {path}"
    try:
        yield llama_cpp, llama_cpp.llama_model_get_vocab(model)
    finally:
        llama_cpp.llama_model_free(model)


def eog_ids(path: Path) -> set[int]:
    with llama_cpp_vocab(path) as (llama_cpp, vocab):
        return {i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)}


def tokenize(path: Path, texts: list[str]) -> list[list[int]]:
    """Ids of each text, as test-tokenizer-0 asks for them: no BOS/EOS, special text not parsed."""
    out = []
    with llama_cpp_vocab(path) as (llama_cpp, vocab):
        for text in texts:
            data = text.encode("utf-8")
            buf = (llama_cpp.llama_token * (len(data) + 16))()
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
            assert n >= 0, f"{path}: llama.cpp needs {-n} tokens for {text!r:.40}"
            out.append(list(buf[:n]))
    return out


__all__ = ["eog_ids", "llama_cpp_vocab", "tokenize"]
