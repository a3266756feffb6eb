"""laguna both ways with llama.cpp (llama-cpp-python), XS.2's form (per-layer heads, sliding layers
with their own plain RoPE beside YaRN, a per-head gate) and M.1's (no window, a per-feature gate):
Strata's f32 file in llama.cpp (logits within 1e-3 of the range of transformers', Strata's greedy
path), and the file llama.cpp's own converter writes in Strata (logits within 1e-4 of transformers',
llama.cpp's greedy path; the same metadata and tensors as Strata's converter writes)."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from tests.fixtures.tiny import llama_cpp_source, zoo
from tests.models.helpers import Bare, rel_err

from .test_qwen35moe_llama_cpp import _greedy, _llama, _logits

llama_cpp = pytest.importorskip("llama_cpp")
needs_source = pytest.mark.skipif(llama_cpp_source() is None,
                                  reason="llama.cpp's source tree not found: set STRATA_LLAMA_CPP_SRC")


@pytest.fixture(scope="module", params=["laguna", "lagunam"])
def tiny(request):
    return zoo().get(request.param)


def test_llama_cpp_runs_stratas_laguna_file(tiny):
    llm, ids, prompt = _llama(tiny.gguf("f32")), tiny.prompt_ids(40), tiny.prompt_ids(16, seed=5)
    assert rel_err(_logits(llm, ids), tiny.hf_logits(ids)) <= 1e-3
    assert Bare(tiny.gguf("f32")).greedy(prompt, 32) == _greedy(llm, prompt, 32)


@needs_source
def test_strata_runs_llama_cpps_laguna_file(tiny):
    path = tiny.llama_cpp_gguf("f32")
    ids, prompt = tiny.prompt_ids(40), tiny.prompt_ids(16, seed=5)
    assert rel_err(Bare(path).forward(ids, 0), tiny.hf_logits(ids)) <= 1e-4
    assert Bare(path).greedy(prompt, 32) == _greedy(_llama(path), prompt, 32)


@needs_source
def test_stratas_converter_writes_llama_cpps_file(tiny):
    """Every `laguna.*` key and every tensor (name, type, shape, values) as llama.cpp's converter
    writes them from the same checkpoint."""
    ours, theirs = GGUFReader(tiny.gguf("f32")), GGUFReader(tiny.llama_cpp_gguf("f32"))

    def keys(r):
        return {f.name: f.contents() for f in r.fields.values() if f.name.startswith("laguna.")}

    assert keys(ours) == keys(theirs)
    mine = {t.name: t for t in ours.tensors}
    assert set(mine) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        m = mine[t.name]
        assert (m.tensor_type, list(m.shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.array_equal(np.array(m.data), np.array(t.data)), t.name


def test_stratas_default_file_in_llama_cpp(tiny):
    """Strata's default file (Q8_0 attention, Q4_K experts) in llama.cpp and in Strata: the same
    top-1 on at least 95% of 64 positions."""
    path, ids = tiny.gguf(None), tiny.prompt_ids(64)
    theirs = _logits(_llama(path), ids)
    ours = Bare(path).forward(ids, 0)
    assert float((theirs.argmax(-1) == ours.argmax(-1)).float().mean()) >= 0.95
