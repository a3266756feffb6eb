"""RoPE context extension and per-layer attention patterns, end to end against transformers.

Tiny random models of transformers' own classes with `rope_parameters` set (YaRN on Qwen3-MoE
and DeepSeek-V3 with mscale_all_dim, linear, longrope and Llama 3's on Mixtral) and gpt-oss with
a non-alternating `layer_types`, converted by strata.convert, give transformers' logits at
positions past the original context (16 positions; the prompts run to 40): on the float path
(prefill, then each decode step) and on packed compute (the fused decode step / decode program
take their cos/sin tables from Python, so they must agree too).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import strata
from strata.gguf import open_model
from strata.models.rope import Rope
from tests.fixtures.rope_scaled import CASES, GPTOSS_PATTERN, ORIG, Scaled, case_spec, scaled

from .helpers import REL_TOL, Bare, rel_err

N_PREFILL, N_DECODE = 24, 16


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("rope-scaled")


@pytest.fixture(params=[*CASES, GPTOSS_PATTERN.key], scope="module")
def case(request, root):
    return scaled(case_spec(request.param), root)


def _float_errors(case: Scaled, ids: list[int], ref: torch.Tensor) -> list[float]:
    bare = Bare(case.path, n_ctx=64)
    errs = [rel_err(bare.forward(ids[:N_PREFILL], 0), ref[:N_PREFILL])]
    return errs + [rel_err(bare.forward([ids[p]], p)[0], ref[p]) for p in range(N_PREFILL, len(ids))]


def _packed_errors(case: Scaled, ids: list[int], ref: torch.Tensor) -> tuple[list[float], object]:
    """Packed compute: prefill, then teacher-forced decode steps (fused step / decode program)."""
    with strata.load(case.path, threads=1, n_ctx=64, max_batch=1, compute="packed", memory="direct") as m:
        t, slot = m.runner, m.cache.allocate()
        first = t(torch.tensor(ids[:N_PREFILL]), m.cache.batch([slot], [0], [N_PREFILL]), m.cache, True)
        errs = [rel_err(first, ref[:N_PREFILL])]
        for p in range(N_PREFILL, len(ids)):
            errs.append(rel_err(t(torch.tensor([ids[p]]), m.cache.batch([slot], [p], [1]), m.cache)[0], ref[p]))
        paths = (t.program is not None, t.steps is not None and all(s is not None for s in t.steps))
    return errs, paths


def test_logits_past_the_original_context_match_transformers(case, record_property):
    ids = case.prompt_ids(N_PREFILL + N_DECODE)
    ref = case.hf_logits(ids)
    errs = _float_errors(case, ids, ref)
    packed, (program, fused) = _packed_errors(case, ids, ref)
    record_property("max_rel_err", max(errs + packed))
    assert max(errs) <= REL_TOL, errs
    assert max(packed) <= REL_TOL, packed
    assert fused and program  # the native decode paths ran (they take the scaled tables)


def test_scaling_changes_the_logits(root):
    """The fixtures would pass vacuously if scaling did nothing past ORIG: with the scaling keys
    dropped, the same weights give other logits there."""
    case = scaled(CASES["qwen3moe-yarn"], root)
    ids = case.prompt_ids(N_PREFILL + N_DECODE)
    ref = case.hf_logits(ids)
    bare = Bare(case.path, n_ctx=64)
    hp = bare.mf.hparams
    plain = dataclasses.replace(hp, rope_scaling=dataclasses.replace(hp.rope_scaling, type="none"))
    bare.model.rope = Rope(plain, torch.device("cpu"))
    for block in bare.model.blocks:
        block.attention.rope = bare.model.rope
    assert rel_err(bare.forward(ids, 0), ref) > 10 * REL_TOL


def test_converted_keys(root):
    """What the converter wrote for each form (llama.cpp's key names)."""
    def hp(key):
        with open_model(scaled(case_spec(key), root).path) as mf:
            return mf.hparams, set(mf.resident)

    y, _ = hp("qwen3moe-yarn-betas")
    assert (y.rope_scaling.type, y.rope_scaling.factor, y.rope_scaling.original_context_length) == ("yarn", 8.0, ORIG)
    assert (y.rope_scaling.yarn_beta_fast, y.rope_scaling.yarn_beta_slow, y.rope_scaling.yarn_attn_factor) == (8.0, 2.0, 1.25)
    assert y.expert_weights_norm is True
    d, _ = hp("deepseek3-mscale")
    assert abs(d.rope_scaling.yarn_log_multiplier - 0.08) < 1e-7 and d.rope_scaling.yarn_attn_factor < 1.0
    lr, names = hp("mixtral-longrope")
    assert lr.rope_scaling.type == "longrope" and {"rope_factors_long.weight", "rope_factors_short.weight"} <= names
    assert lr.rope_scaling.attn_factor > 1.0
    l3, names = hp("mixtral-llama3")
    assert l3.rope_scaling.type == "none" and "rope_freqs.weight" in names
    g, _ = hp("gptoss-pattern")
    assert g.swa_layers == (False, True, True, False) and [g.is_swa(i) for i in range(4)] == [False, True, True, False]
