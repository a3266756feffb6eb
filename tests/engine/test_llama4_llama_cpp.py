"""llama4 files in llama.cpp (llama-cpp-python) and in Strata, both ways, on the fixture with
llama.cpp's fixed chunk (8192), temperature floor (8192) and scale (0.1) ("llama4cpp": its chunks
and temperature are then the same as transformers' everywhere llama.cpp runs it): Strata's f32
file in llama.cpp within 1e-3 of transformers' logit range with the greedy path Strata takes;
q8_0 / default files top-1 vs llama.cpp; llama.cpp's converter's files in Strata within 1e-4."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import llama_cpp_source, zoo

from .test_llama_cpp import N_CTX, LlamaCpp
from .test_new_archs_llama_cpp import _rel, _top1, check_f32_file_in_llama_cpp, quantized_logits

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")

needs_source = pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree (convert_hf_to_gguf.py) "
                                  "not found: set STRATA_LLAMA_CPP_SRC")


@pytest.fixture(scope="module")
def tiny():
    return zoo().get("llama4cpp")


def _load(path, compute="float"):
    return strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1, compute=compute)


def test_strata_f32_file_in_llama_cpp(tiny, record_property):
    check_f32_file_in_llama_cpp(tiny, record_property)


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_strata_quantized_files_in_llama_cpp(tiny, outtype):
    _, got, ours = quantized_logits(tiny, outtype, "packed")
    assert _top1(got, ours) >= 0.9  # the same file in both engines


@needs_source
def test_llama_cpp_converted_files_in_strata(tiny, record_property):
    path = tiny.llama_cpp_gguf("f32")
    ids = tiny.prompt_ids(32)
    prompt = tiny.prompt_ids(16, seed=21)
    with _load(path) as ours:
        err = _rel(ours.logits(ids), tiny.hf_logits(ids))
        record_property("strata_on_llama_cpp_file_rel_err", err)
        assert err <= 1e-4
        mine = ours.generate(prompt, temperature=0, max_tokens=32, stop_token_ids=()).token_ids
    ids_hf = list(prompt)
    with torch.no_grad():
        for _ in range(32):
            ids_hf.append(int(tiny.model(torch.tensor([ids_hf])).logits[0, -1].argmax()))
    llama = LlamaCpp(path)
    assert mine == llama.greedy(prompt, 32) == ids_hf[16:]
    llama.close()
    ids = tiny.prompt_ids(96)
    with _load(tiny.llama_cpp_gguf("q8_0"), "packed") as q8:
        assert _top1(q8.logits(ids), tiny.hf_logits(ids)) >= 0.9
