"""deepseek2, gpt-oss, glm4moe, minimax-m2 and hy_v3 files in llama.cpp (llama-cpp-python) and in
Strata, both ways: Strata's files in llama.cpp (f32 logits within 1e-3 of the range of
transformers', identical greedy paths; q8_0 and default files top-1 >= 95%), and files written by
llama.cpp's own converter in Strata (logits within 1e-4 of the range of transformers', top-1 >= 95%
on q8_0)."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import llama_cpp_source, zoo

from .test_llama_cpp import N_CTX, LlamaCpp

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")

needs_source = pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree (convert_hf_to_gguf.py) "
                                  "not found: set STRATA_LLAMA_CPP_SRC")


# DeepSeek-V2 (no query LoRA: llama.cpp needs its "lite" depth) has its own module, test_deepseek_v2_llama_cpp
@pytest.fixture(params=("deepseek3", "gptoss", "glm4moe", "minimax", "hyv3"), scope="module")
def new(request):
    return zoo().get(request.param)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean())


def check_f32_file_in_llama_cpp(tiny, record_property) -> None:
    """Strata's f32 file in llama.cpp: logits within 1e-3 of the range of transformers', and the
    greedy path Strata takes on the same file."""
    llama = LlamaCpp(tiny.gguf("f32"))
    ids = tiny.prompt_ids(64)
    err = _rel(llama.logits(ids), tiny.hf_logits(ids))
    record_property("llama_cpp_rel_err", err)
    assert err <= 1e-3
    prompt = tiny.prompt_ids(16, seed=21)
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=N_CTX, max_batch=1) as ours:
        assert ours.generate(prompt, temperature=0, max_tokens=32, stop_token_ids=()).token_ids == \
            llama.greedy(prompt, 32)
    llama.close()


def test_strata_f32_file_in_llama_cpp(new, record_property):
    check_f32_file_in_llama_cpp(new, record_property)


def quantized_logits(tiny, outtype: str | None, compute: str = "float"):
    """(ids, llama.cpp's logits, Strata's) on Strata's q8_0 / default (None) file, 96 tokens."""
    path = tiny.gguf(outtype)
    llama = LlamaCpp(path)
    ids = tiny.prompt_ids(96)
    got = llama.logits(ids)
    llama.close()
    with strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1, compute=compute) as ours:
        return ids, got, ours.logits(ids)


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_strata_quantized_files_in_llama_cpp(new, outtype):
    ids, got, ours = quantized_logits(new, outtype)
    assert _top1(got, new.hf_logits(ids)) >= (0.95 if outtype else 0.9)
    assert _top1(got, ours) >= 0.95  # the same file in both engines


@needs_source
def test_llama_cpp_converted_files_in_strata(new, record_property):
    path = new.llama_cpp_gguf("f32")
    ours = strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1)
    ids = new.prompt_ids(32)
    err = _rel(ours.logits(ids), new.hf_logits(ids))
    record_property("strata_on_llama_cpp_file_rel_err", err)
    assert err <= 1e-4
    llama = LlamaCpp(path)
    prompt = new.prompt_ids(16, seed=21)
    assert ours.generate(prompt, temperature=0, max_tokens=32, stop_token_ids=()).token_ids == llama.greedy(prompt, 32)
    llama.close()
    q8 = new.llama_cpp_gguf("q8_0")
    ids = new.prompt_ids(96)
    assert _top1(strata.load(q8, threads=1, n_ctx=N_CTX, max_batch=1).logits(ids), new.hf_logits(ids)) >= 0.95


def test_gpt_oss_mxfp4_experts_in_llama_cpp(tmp_path):
    """llama.cpp reads Strata's MXFP4 experts as its own (its gpt-oss releases are MXFP4): the same
    tokens as Strata's packed compute on the file."""
    from converters import TypePolicy, convert
    tiny = zoo().get("gptoss")
    path = tmp_path / "gptoss-mxfp4.gguf"
    convert(tiny.hf_dir, path, TypePolicy.from_args(experts="mxfp4"), n_threads=2)
    ids = tiny.prompt_ids(96)
    llama = LlamaCpp(path)
    got = llama.logits(ids)
    llama.close()
    with strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1, compute="packed") as ours:
        assert _top1(got, ours.logits(ids)) >= 0.95
