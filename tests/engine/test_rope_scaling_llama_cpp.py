"""Files with RoPE context extension (YaRN, DeepSeek's YaRN, linear, longrope, Llama 3's factors)
and a per-layer sliding-window pattern, written by strata.convert, in llama.cpp: its logits past
the original context agree with transformers' (1e-3 of the range, as for every f32 file) and with
Strata's on the same file.

Not here, by design: YaRN with explicit betas or attention_factor, and DeepSeek's mscale !=
mscale_all_dim (llama.cpp's loader ignores those keys for these architectures; Strata follows
transformers, tests/models/test_rope_scaling_logits.py)."""
from __future__ import annotations

import pytest

import strata
from tests.fixtures.rope_scaled import case_spec, scaled

from .test_llama_cpp import N_CTX, LlamaCpp

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("rope-scaled-llama-cpp")


@pytest.mark.parametrize("key", ["qwen3moe-yarn", "deepseek3-yarn", "mixtral-linear", "mixtral-longrope",
                                 "mixtral-llama3", "llama4-llama3", "gptoss-pattern"])
def test_scaled_files_in_llama_cpp(root, key, record_property):
    case = scaled(case_spec(key), root)
    ids = case.prompt_ids(48)  # the original context is 16
    ref = case.hf_logits(ids)
    llama = LlamaCpp(case.path)  # n_ctx 256 > 16: longrope's long factors, as Strata takes them
    got = llama.logits(ids)
    llama.close()
    with strata.load(case.path, threads=1, n_ctx=N_CTX, max_batch=1) as ours:
        mine = ours.logits(ids)
    err = float((got - ref).abs().max() / ref.abs().max())
    record_property("llama_cpp_rel_err", err)
    assert err <= 1e-3
    assert float((got - mine).abs().max() / mine.abs().max()) <= 1e-3
