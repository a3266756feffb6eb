"""Files quantized by llama.cpp's own quantizer (`llama_model_quantize`, the code `llama-quantize`
runs, with its per-tensor type mixing, `--imatrix` and `--tensor-type` overrides; see
quantize_fixtures.py), in every type published MoE quants use and in one "dynamic" mix of them,
run in Strata and agree with llama.cpp on the same file.

Bars, for each file and both of Strata's compute paths (packed: native kernels on the GGUF
blocks, activations rounded to 8-bit blocks as llama.cpp does; float: dequantized weights, torch
products): top-1 agreement with llama.cpp >= 0.9 over two 96-token prompts, and the largest
logit difference within a bound relative to the range of llama.cpp's logits (FACTS: quantized
matmuls alone differ by ~1e-2 of the range). The file's tensor types are read back first, so a
quantizer that quietly fell back to another type fails rather than testing that type.
"""
from __future__ import annotations

import pytest
import torch

import strata
from tests.interop.quantize_fixtures import CASES, LlamaQuantized, expected_types, tensor_types

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")

from tests.engine.test_llama_cpp import N_CTX, LlamaCpp  # noqa: E402  (needs llama_cpp)

SEEDS = (1, 2)
N_TOKENS = 96
#: max |dlogit| / range of llama.cpp's logits, Strata vs llama.cpp on the same quantized file.
MAX_REL = {"packed": 0.05, "float": 0.05}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> LlamaQuantized:
    return LlamaQuantized(tmp_path_factory.mktemp("llama-quantized"))


@pytest.fixture(scope="module")
def llama_logits(quantized):
    """llama.cpp's logits [T, V] per (file key, seed), each computed once."""
    cache = {}

    def get(key: str) -> list[torch.Tensor]:
        if key not in cache:
            ref = LlamaCpp(quantized.file(key))
            try:
                cache[key] = [ref.logits(quantized.tiny.prompt_ids(N_TOKENS, seed=s)) for s in SEEDS]
            finally:
                ref.close()
        return cache[key]

    return get


@pytest.mark.parametrize("key", list(CASES))
def test_file_holds_the_intended_types(quantized, key):
    types = tensor_types(quantized.file(key))
    want = expected_types(CASES[key], types)
    assert len(want) >= 4, sorted(types)  # both layers' gate and up experts at least
    wrong = {n: (types[n].name, t.name) for n, t in want.items() if types[n] != t}
    assert not wrong, f"tensor: (found, intended) {wrong}"


@pytest.mark.parametrize("compute", ["packed", "float"])
@pytest.mark.parametrize("key", list(CASES))
def test_strata_agrees_with_llama_cpp(quantized, llama_logits, key, compute, record_property, capsys):
    theirs = llama_logits(key)
    with strata.load(quantized.file(key), threads=1, n_ctx=N_CTX, max_batch=1, compute=compute) as ours:
        mine = [ours.logits(quantized.tiny.prompt_ids(N_TOKENS, seed=s)) for s in SEEDS]
    a, b = torch.cat(mine), torch.cat(theirs)
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    rel = float((a - b).abs().max() / (b.max() - b.min()))
    record_property("top1", top1)
    record_property("max_rel_dlogit", rel)
    with capsys.disabled():
        print(f"\n[llama-quantized {key} {compute}] top-1 {top1:.3f}, max |dlogit|/range {rel:.4f}")
    assert top1 >= 0.9, (key, compute, top1)
    assert rel <= MAX_REL[compute], (key, compute, rel)
