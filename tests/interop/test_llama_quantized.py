"""Files quantized by llama.cpp's own quantizer (`llama_model_quantize`, the code `llama-quantize`
runs, with its per-tensor type mixing, `--imatrix` and `--tensor-type` overrides; see
quantize_fixtures.py), in every type published MoE quants use and in one "dynamic" mix of them,
run in Strata and agree with llama.cpp on the same file.

Bars, for each file and both of Strata's compute paths (packed: native kernels on the GGUF
blocks, activations rounded to 8-bit blocks; float: dequantized weights, torch products), over
three 96-token prompts: top-1 agreement with llama.cpp >= 0.9, and at 9 positions in 10 the
largest logit difference <= 3% of the range of llama.cpp's logits. Measured: a median of ~0.9%
(FACTS: quantized matmuls alone differ by ~1e-2 of the range) and a 90th percentile of 1.0-1.5% in
every type; the few positions beyond (1-6 of 288) are near-tied routers picking another expert in
one engine, up to ~50% of the range, so the largest difference bounds nothing and is reported only.
A wrong expert, block or type moves every position that uses it, i.e. most of them: the fixture's
experts and attention are scaled so that they decide the logits (test_the_fixture_depends_...).
Measured power: Strata on the Q5_K file against llama.cpp on the Q6_K file (weights ~1% apart)
fails both bars (top-1 0.76, 90th percentile 6%), IQ4_NL against IQ4_XS too (0.76, 5%).
The file's tensor types are read back first, so a quantizer that quietly fell back to another type
fails rather than testing that type. Strata's float path is also held to transformers on the
file's weights as gguf.quants dequantizes them (measured: identical, to the bit).
"""
from __future__ import annotations

import copy

import pytest
import torch

import strata
from tests.convert.readback import model_from_gguf
from tests.interop.quantize_fixtures import CASES, expected_types, tensor_types

pytestmark = pytest.mark.interop
llama_cpp = pytest.importorskip("llama_cpp")

from tests.engine.test_llama_cpp import N_CTX, LlamaCpp  # noqa: E402  (needs llama_cpp)

SEEDS = (1, 2, 3)
N_TOKENS = 96
MIN_TOP1 = 0.9
#: Bound on the 90th percentile over positions of max |dlogit| / range of llama.cpp's logits.
MAX_REL_Q90 = 0.03


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


def _top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean())


@torch.no_grad()
@pytest.mark.parametrize("part,bar", [("mlp.experts", 0.1), ("self_attn.o_proj", 0.5)])
def test_the_fixture_depends_on_its_experts_and_attention(quantized, part, bar):
    """What gives the comparisons their power: with its experts (or attention outputs) zeroed the
    fixture model's top-1 changes at most positions, so a Strata that got them wrong would fail."""
    tiny = quantized.tiny
    ids = tiny.prompt_ids(N_TOKENS, seed=SEEDS[0])
    model = copy.deepcopy(tiny.model)
    for name, p in model.named_parameters():
        if part in name:
            p.zero_()
    assert _top1(model(torch.tensor([ids])).logits[0], tiny.hf_logits(ids)) <= bar


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
    top1 = _top1(a, b)
    rel = (a - b).abs().max(-1).values / (b.max() - b.min())  # [T]
    q50, q90, worst = (float(torch.quantile(rel, q)) for q in (0.5, 0.9, 1.0))
    for name, value in (("top1", top1), ("rel_dlogit_q50", q50), ("rel_dlogit_q90", q90), ("rel_dlogit_max", worst)):
        record_property(name, value)
    with capsys.disabled():
        print(f"\n[llama-quantized {key} {compute}] top-1 {top1:.3f}, max |dlogit|/range at a position: "
              f"median {q50:.4f}, 90th percentile {q90:.4f}, largest {worst:.4f}")
    assert top1 >= MIN_TOP1, (key, compute, top1)
    assert q90 <= MAX_REL_Q90, (key, compute, q90)


@torch.no_grad()
@pytest.mark.parametrize("key", list(CASES))
def test_strata_float_path_is_the_files_dequantized_weights(quantized, key, record_property):
    """Strata's float path on the file against transformers' model carrying the file's weights as
    gguf.quants (the bit-level truth of every format) dequantizes them: the same maths to float32
    rounding, so nothing of the types is lost between the file and Strata's products."""
    path, ids = quantized.file(key), quantized.tiny.prompt_ids(N_TOKENS, seed=SEEDS[0])
    want = model_from_gguf(quantized.tiny, path)(torch.tensor([ids])).logits[0]
    with strata.load(path, threads=1, n_ctx=N_CTX, max_batch=1, compute="float") as ours:
        got = ours.logits(ids)
    rel = float((got - want).abs().max() / (want.max() - want.min()))
    record_property("rel_vs_dequantized", rel)
    assert rel <= 1e-4, (key, rel)
