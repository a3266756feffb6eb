"""Strata's qwen3next file in llama.cpp (llama-cpp-python): its logits equal Strata's within the
interop tolerance (1e-3 of the range, f32) and its greedy path is Strata's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.tiny import zoo
from tests.models.helpers import Bare, rel_err

llama_cpp = pytest.importorskip("llama_cpp")


def test_llama_cpp_runs_stratas_qwen3next_file():
    tiny = zoo().get("qwen3next")
    path = str(tiny.gguf("f32"))
    llm = llama_cpp.Llama(path, n_ctx=96, logits_all=True, verbose=False, n_threads=1)
    ids = tiny.prompt_ids(20)
    llm.eval(ids)
    theirs = torch.tensor(np.array(llm.scores[:len(ids)]))
    assert rel_err(Bare(tiny.gguf("f32")).forward(ids, 0), theirs) <= 1e-3
    prompt = tiny.prompt_ids(16, seed=5)
    llm.reset()
    greedy = [t for _, t in zip(range(24), llm.generate(prompt, temp=0.0))]
    assert Bare(tiny.gguf("f32")).greedy(prompt, 24) == greedy
