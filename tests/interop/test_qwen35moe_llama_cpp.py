"""qwen35moe both ways with llama.cpp (llama-cpp-python): Strata's f32 file in llama.cpp (logits
within 1e-3 of the range of transformers', Strata's greedy path), and the file llama.cpp's own
converter writes in Strata (logits within 1e-4 of transformers', llama.cpp's greedy path)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.tiny import llama_cpp_source, zoo
from tests.models.helpers import Bare, rel_err

llama_cpp = pytest.importorskip("llama_cpp")


def _llama(path):
    return llama_cpp.Llama(str(path), n_ctx=96, logits_all=True, verbose=False, n_threads=1)


def _logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return torch.tensor(np.array(llm.scores[:len(ids)]))


def _greedy(llm, prompt, n):
    llm.reset()
    return [t for _, t in zip(range(n), llm.generate(prompt, temp=0.0))]


def test_llama_cpp_runs_stratas_qwen35moe_file():
    tiny = zoo().get("qwen35moe")
    llm, ids, prompt = _llama(tiny.gguf("f32")), tiny.prompt_ids(20), tiny.prompt_ids(16, seed=5)
    assert rel_err(_logits(llm, ids), tiny.hf_logits(ids)) <= 1e-3
    assert Bare(tiny.gguf("f32")).greedy(prompt, 24) == _greedy(llm, prompt, 24)


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")
def test_strata_runs_llama_cpps_qwen35moe_file():
    tiny = zoo().get("qwen35moe")
    path = tiny.llama_cpp_gguf("f32")
    ids, prompt = tiny.prompt_ids(20), tiny.prompt_ids(16, seed=5)
    assert rel_err(Bare(path).forward(ids, 0), tiny.hf_logits(ids)) <= 1e-4
    assert Bare(path).greedy(prompt, 24) == _greedy(_llama(path), prompt, 24)
