"""DeepSeek-V2 files (deepseek2 without query LoRA or selection bias) in llama.cpp and in Strata,
both ways, on the 26-layer "lite" fixture (llama.cpp reads `attn_q` only at lite depths).

GGUF has no key for V2's group score (a group's best expert): llama.cpp sums each group's top two
(V3's rule) for every deepseek2 file, so on a grouped V2 file it routes some tokens otherwise than
DeepSeek's own code. Strata follows transformers; with its routers set to llama.cpp's rule it
computes what llama.cpp computes. Measured here: llama.cpp vs Strata-with-llama.cpp's-rule 2.1e-5
of the range, vs transformers 4.4e-3 (top-1 0.98)."""
from __future__ import annotations

import pytest
import torch

import strata
from tests.fixtures.tiny import llama_cpp_source, zoo

from .test_llama_cpp import N_CTX, LlamaCpp

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean())


def _load(path, llama_cpp_rule: bool = False):
    engine = strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1)
    routers = [b.ffn.router for b in engine.transformer.blocks if hasattr(b.ffn, "router")]
    assert routers and all(r.group_score == "max" and r.selection_bias is None for r in routers)
    if llama_cpp_rule:
        from strata.runtime import Runner
        for r in routers:
            r.group_score = "top2"
        # the fused steps and the program took the rule at load: build them again
        engine.runner = engine.engine.model = Runner.of(engine.transformer, engine.plan, engine.memory)
    return engine


@pytest.fixture(scope="module")
def lite():
    return zoo().get("deepseek2lite")


def test_strata_v2_files_in_llama_cpp(lite, record_property):
    ids, prompt = lite.prompt_ids(96), lite.prompt_ids(16, seed=21)
    ref = lite.hf_logits(ids)
    assert _rel(_load(lite.gguf("f32")).logits(ids), ref) <= 1e-4  # Strata itself: transformers' routing
    llama = LlamaCpp(lite.gguf("f32"))
    got = llama.logits(ids)
    same_rule = _load(lite.gguf("f32"), llama_cpp_rule=True)
    err = _rel(got, same_rule.logits(ids))
    record_property("llama_cpp_vs_strata_rel_err", err)
    assert err <= 1e-3
    assert _top1(got, ref) >= 0.95  # transformers: only group choices differ
    tokens = same_rule.generate(prompt, temperature=0, max_tokens=32, stop_token_ids=()).token_ids
    assert tokens == llama.greedy(prompt, 32)
    llama.close()
    llama = LlamaCpp(lite.gguf("q8_0"))
    got = llama.logits(ids)
    llama.close()
    assert _top1(got, _load(lite.gguf("q8_0"), llama_cpp_rule=True).logits(ids)) >= 0.95


@pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree (convert_hf_to_gguf.py) not found: "
                    "set STRATA_LLAMA_CPP_SRC")
def test_llama_cpp_converted_v2_file_in_strata(lite, record_property):
    """llama.cpp's converter writes the same group keys and no gating key (softmax, the default):
    Strata reads its file as transformers computes, greedy path included."""
    from gguf import GGUFReader
    path = lite.llama_cpp_gguf("f32")
    fields = {f.name: f.contents() for f in GGUFReader(path).fields.values()}
    assert (fields["deepseek2.expert_group_count"], fields["deepseek2.expert_group_used_count"]) == (4, 1)
    assert "deepseek2.expert_gating_func" not in fields and "deepseek2.attention.q_lora_rank" not in fields
    ids = lite.prompt_ids(32)
    ours = _load(path)
    err = _rel(ours.logits(ids), lite.hf_logits(ids))
    record_property("strata_on_llama_cpp_file_rel_err", err)
    assert err <= 1e-4
    prompt = lite.prompt_ids(16, seed=21)
    want = list(prompt)
    with torch.no_grad():
        for _ in range(32):
            want.append(int(lite.model(torch.tensor([want])).logits[0, -1].argmax()))
    assert ours.generate(prompt, temperature=0, max_tokens=32, stop_token_ids=()).token_ids == want[16:]
