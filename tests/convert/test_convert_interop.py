"""Converted files in llama.cpp (llama-cpp-python): loading, logits against transformers, tokenizer."""
from __future__ import annotations

import numpy as np
import pytest

from readback import model_from_gguf

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")


def llama_logits(path, ids: list[int]) -> np.ndarray:
    llm = llama_cpp.Llama(str(path), n_ctx=256, n_batch=256, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


def top1(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).mean())


def test_f32_logits_match_transformers(tiny):
    ids = tiny.prompt_ids()
    want, got = tiny.logits(ids), llama_logits(tiny.gguf("f32"), ids)
    spread = want.max() - want.min()
    assert np.abs(got - want).max() <= 1e-3 * spread
    assert top1(got, want) == 1.0


def test_q8_0_top1_agreement(tiny):
    ids = tiny.prompt_ids()
    assert top1(llama_logits(tiny.gguf("q8_0"), ids), tiny.logits(ids)) >= 0.95


def test_default_file_means_its_dequantized_weights(tiny, record_property, capsys):
    """llama.cpp on the q8_0/q4_k file agrees with transformers running the file's own dequantized
    weights: what is left is the rounding of activations inside llama.cpp's quantized matmuls. Its
    agreement with the unquantized model is reported."""
    path, ids = tiny.gguf(), tiny.prompt_ids()
    got = llama_logits(path, ids)
    dequantized = tiny.logits(ids, model_from_gguf(tiny, path))
    assert top1(got, dequantized) >= 0.95
    vs_source = top1(got, tiny.logits(ids))
    record_property("top1_vs_unquantized", vs_source)
    with capsys.disabled():
        print(f"\n[{tiny.spec.key}] default file: top-1 vs dequantized-weights model "
              f"{top1(got, dequantized):.3f}, vs unquantized model {vs_source:.3f}")


def test_tokenizer_ids_match_source(tiny, tricky_strings):
    llm = llama_cpp.Llama(str(tiny.gguf()), vocab_only=True, verbose=False)
    try:
        for text in tricky_strings:
            want = tiny.tokenizer.encode(text).ids
            got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            assert got == want, f"{text!r}: llama.cpp {got} != source {want}"
    finally:
        llm.close()
