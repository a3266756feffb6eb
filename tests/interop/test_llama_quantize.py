"""The one in-process llama.cpp quantizer the interop fixtures and benchmarks/packed_vs_llama.py
share: requantizing with an importance matrix of ones (the benchmark's i-quant files), and its
refusals named."""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from benchmarks.bench_files import file_types, ones_imatrix  # noqa: E402
from tests.fixtures.tiny import zoo  # noqa: E402
from tests.interop.llama_quantize import llama_quantize  # noqa: E402


def test_requantize_with_ones_imatrix(tmp_path):
    src = zoo().get("qwen3moe").gguf("f32")
    q8 = llama_quantize(src, tmp_path / "q8.gguf", "Q8_0")
    assert "Q8_0" in file_types(q8)
    with pytest.raises(RuntimeError, match=r"q8.gguf -> .*q4.gguf \(Q4_0\) failed: .*requantiz"):
        llama_quantize(q8, tmp_path / "q4.gguf", "Q4_0")
    q4 = llama_quantize(q8, tmp_path / "q4.gguf", "Q4_0", imatrix=ones_imatrix(q8), allow_requantize=True)
    assert "Q4_0" in file_types(q4) and "F32" in file_types(q4)  # norms stay f32


def test_unknown_file_type_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"out.gguf: unknown llama.cpp file type 'Q9_9'"):
        llama_quantize(tmp_path / "in.gguf", tmp_path / "out.gguf", "Q9_9")
