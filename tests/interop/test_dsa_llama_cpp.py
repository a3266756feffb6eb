"""Sparse latent attention with llama.cpp (llama-cpp-python): the file llama.cpp's own converter
makes from the tiny checkpoint runs in Strata with transformers' logits and llama.cpp's greedy
tokens; Strata's file runs in llama.cpp with Strata's logits (within the interop tolerance, 1e-3
of the range: llama.cpp's latent cache is f16) and Strata's greedy tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.tiny import GGUF_ARCH, llama_cpp_source, zoo
from tests.models.helpers import REL_TOL, Bare, rel_err

llama_cpp = pytest.importorskip("llama_cpp")
KEYS = ("deepseek32", "glmdsa")


@pytest.fixture(params=KEYS, scope="module")
def tiny(request):
    return zoo().get(request.param)


def _greedy(path, prompt: list[int], n: int) -> list[int]:
    llm = llama_cpp.Llama(str(path), n_ctx=96, verbose=False, n_threads=1)
    return [t for _, t in zip(range(n), llm.generate(prompt, temp=0.0))]


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")
def test_llama_cpp_converted_file_runs_in_strata(tiny):
    path = tiny.llama_cpp_gguf("f32")
    bare = Bare(path)
    assert bare.mf.arch == GGUF_ARCH[tiny.key]
    ids = tiny.prompt_ids(36)
    assert rel_err(bare.forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    prompt = tiny.prompt_ids(16, seed=5)
    assert Bare(path).greedy(prompt, 32) == _greedy(path, prompt, 32)


def test_llama_cpp_runs_stratas_file(tiny):
    path = tiny.gguf("f32")
    llm = llama_cpp.Llama(str(path), n_ctx=96, logits_all=True, verbose=False, n_threads=1)
    ids = tiny.prompt_ids(36)
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[:len(ids)]))
    assert rel_err(Bare(path).forward(ids, 0), theirs) <= 1e-3
    for seed in (5, 21):
        prompt = tiny.prompt_ids(16, seed=seed)
        assert Bare(path).greedy(prompt, 32) == _greedy(path, prompt, 32)


def test_llama_cpp_runs_stratas_file_with_an_mtp_layer(tiny, tmp_path):
    """Strata's file with the checkpoint's MTP layer kept loads in llama.cpp, whose greedy tokens
    (its trunk; the MTP block is not in its main graph) are Strata's."""
    from converters import TypePolicy, convert
    from tests.convert.test_convert_dsa import _with_mtp_layer
    _with_mtp_layer(tiny, tmp_path / "hf")
    path = tmp_path / "mtp.gguf"
    convert(tmp_path / "hf", path, TypePolicy.from_args(outtype="f32"))
    prompt = tiny.prompt_ids(16, seed=5)
    assert Bare(path).greedy(prompt, 24) == _greedy(path, prompt, 24)
