"""MiMo-V2-Flash (`mimo2`) against transformers' MiMoV2FlashForCausalLM and llama.cpp on the bar of
the other families (tiny model: full, sliding, sliding, full attention; 1 kv head on full layers,
2 with sinks on sliding ones; key heads of 96, value heads of 64, values scaled by 0.707; RoPE on
32 features with a base per layer type; a dense first layer, then a sigmoid router with a
selection bias). llama.cpp's converter's file and Strata's, float and packed compute, every
memory, the fused decode step and program, and the MTP blocks kept beside the trunk."""
from __future__ import annotations

import io
import json
import types

import numpy as np
import pytest
import torch

import strata
from strata.commands import inspect as inspect_cmd
from strata.gguf import open_model
from tests.engine.test_fused_decode import _check_fused_equals_per_call
from tests.fixtures.tiny import llama_cpp_source, zoo

from .helpers import (REL_TOL, Bare, check_packed_every_memory, load, rel_err, tiny_fixture)

tiny = tiny_fixture("mimo2")
needs_llama_cpp = pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found")


def _llama(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(str(path), n_ctx=96, logits_all=True, verbose=False, n_threads=1)


def _greedy(llm, prompt, n):
    llm.reset()
    return [t for _, t in zip(range(n), llm.generate(prompt, temp=0.0))]


# -- 1. the file llama.cpp's converter writes -------------------------------------------------

@needs_llama_cpp
def test_llama_cpps_file_opens_with_its_per_layer_attention(tiny):
    cfg = tiny.model.config
    with open_model(tiny.llama_cpp_gguf("f32")) as mf:
        hp = mf.hparams
        assert (hp.arch, hp.n_layers, hp.n_layers_nextn) == ("mimo2", 4, 0)
        assert hp.kv_heads == (1, 2, 2, 1) and hp.swa_layers == (False, True, True, False)
        assert (hp.head_dim, hp.head_dim_v, hp.rope_dim) == (cfg.head_dim, cfg.v_head_dim, 32)
        assert (hp.rope_freq_base, hp.rope_freq_base_swa, hp.sliding_window) == (5e6, 1e4, 8)
        assert hp.attn_value_scale == pytest.approx(0.707) and hp.expert_gating_func == "sigmoid"
        assert mf.expert_layers == [1, 2, 3]
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model=str(tiny.llama_cpp_gguf("f32")), json=True), out) == 0
    verdict = json.loads(out.getvalue())["verdict"]
    assert verdict["runs"] and verdict["sentence"].startswith("runs: mimo2"), verdict


@needs_llama_cpp
def test_strata_runs_llama_cpps_file(tiny):
    """llama.cpp's converter's file: transformers' logits within 1e-4, llama.cpp's greedy path."""
    path = tiny.llama_cpp_gguf("f32")
    ids, prompt = tiny.prompt_ids(24), tiny.prompt_ids(16, seed=5)
    assert rel_err(Bare(path).forward(ids, 0), tiny.hf_logits(ids)) <= REL_TOL
    assert Bare(path).greedy(prompt, 32) == _greedy(_llama(path), prompt, 32)


# -- 2. the maths ------------------------------------------------------------------------------

def test_layers_are_as_transformers_builds_them(tiny):
    bare = Bare(tiny.gguf("f32"))
    att = [b.attention for b in bare.model.blocks]
    assert [a.n_head_kv for a in att] == [1, 2, 2, 1] and [a.window for a in att] == [0, 8, 8, 0]
    assert [a.w.sinks is not None for a in att] == [False, True, True, False]
    assert all((a.head_dim, a.head_dim_v, a.v_scale) == (96, 64, pytest.approx(0.707)) for a in att)
    assert att[0].rope is att[3].rope is not att[1].rope  # the sliding layers' own base
    k, v = bare.cache.k, bare.cache.v  # per layer [N, Hkv, P, row]: values padded to the key width
    assert [t.shape[1] for t in k] == [1, 2, 2, 1] and all(t.shape[-1] == 96 for t in k + v)


def test_what_mimo2_adds_matters(tiny):
    """The value scale, the sinks and the sliding layers' own base each move the logits past the bar
    (the base least: the window keeps distances short)."""
    ids = tiny.prompt_ids(24)
    ref = tiny.hf_logits(ids)
    for spoil in ("v_scale", "sinks", "rope"):
        bare = Bare(tiny.gguf("f32"))
        for att in (bare.model.blocks[1].attention, bare.model.blocks[2].attention):
            if spoil == "v_scale":
                att.v_scale = 1.0
            elif spoil == "sinks":
                att.w.sinks = None
            else:
                att.rope = bare.model.blocks[0].attention.rope
        assert rel_err(bare.forward(ids, 0), ref) > 3 * REL_TOL, spoil


# -- 3. Strata's converter ---------------------------------------------------------------------

@needs_llama_cpp
def test_stratas_file_is_llama_cpps(tiny):
    """The same metadata (per-layer arrays, value scale, window) and tensors, bit for bit in f32."""
    from gguf import GGUFReader

    theirs, ours = GGUFReader(tiny.llama_cpp_gguf("f32")), GGUFReader(tiny.gguf("f32"))
    keys = {k: v.contents() for k, v in theirs.fields.items() if k.startswith("mimo2.")}
    assert keys == {k: v.contents() for k, v in ours.fields.items() if k.startswith("mimo2.")}
    want = {t.name: np.array(t.data) for t in theirs.tensors}
    assert sorted(want) == sorted(t.name for t in ours.tensors)
    for t in ours.tensors:
        assert t.tensor_type == theirs.tensors[[x.name for x in theirs.tensors].index(t.name)].tensor_type
        assert np.array_equal(np.array(t.data), want[t.name]), t.name


def test_llama_cpp_runs_stratas_file(tiny):
    """Strata's f32 file in llama.cpp: transformers' logits within 1e-3, Strata's greedy path; the
    default (Q8_0 / Q4_K) file: the same greedy tokens."""
    llm, ids, prompt = _llama(tiny.gguf("f32")), tiny.prompt_ids(20), tiny.prompt_ids(16, seed=5)
    llm.eval(ids)
    assert rel_err(torch.tensor(np.array(llm.scores[:len(ids)])), tiny.hf_logits(ids)) <= 1e-3
    assert Bare(tiny.gguf("f32")).greedy(prompt, 24) == _greedy(llm, prompt, 24)
    assert Bare(tiny.gguf(None)).greedy(prompt, 24) == _greedy(_llama(tiny.gguf(None)), prompt, 24)


def test_converter_refuses_what_gguf_cannot_say(tiny, tmp_path):
    import shutil

    from converters import TypePolicy, convert
    from converters.source import ConversionError

    for key, value, says in (("swa_head_dim", 64, "swa_head_dim"), ("hybrid_layer_pattern", [0, 1], "hybrid_layer_pattern"),
                             ("n_group", 2, "n_group")):
        bad = tmp_path / key
        shutil.copytree(tiny.hf_dir, bad)
        cfg = json.loads((bad / "config.json").read_text())
        cfg[key] = value
        (bad / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ConversionError, match=says):
            convert(bad, tmp_path / f"{key}.gguf", TypePolicy.from_args(outtype="f32"), n_threads=1)


# -- 4. multi-token-prediction layers ----------------------------------------------------------

def test_mtp_layers_are_converted_loaded_and_kept():
    """The checkpoint's 3 MTP layers: Strata's converter writes them after the trunk as llama.cpp's
    does; a load keeps them (their records and values), and the main forward does not run them."""
    mtp = zoo().get("mimo2mtp")
    with open_model(mtp.gguf("f32")) as mf:
        hp = mf.hparams
        assert (hp.n_layers, hp.n_layers_nextn, hp.kv_heads) == (4, 3, (1, 2, 2, 1))
        assert sorted({int(n.split(".")[1]) for n in mf.nextn}) == [4, 5, 6]
        assert "blk.4.nextn.eh_proj.weight" in mf.nextn and "blk.6.layer_output_norm.weight" in mf.nextn
    bare = Bare(mtp.gguf("f32"))
    nextn = bare.model.nextn
    assert [b.index for b in nextn.blocks] == [4, 5, 6] and len(bare.model.blocks) == 4
    from tests.convert.mimo2_checkpoint import mtp_tensors
    hf = mtp_tensors(mtp.model, 3)
    assert torch.equal(nextn.weight("blk.5.nextn.eh_proj.weight"), hf["model.mtp.layers.1.eh_proj.weight"])
    assert torch.equal(nextn.weight("blk.6.attn_sinks.weight"), hf["model.mtp.layers.2.self_attn.attention_sink_bias"])
    ids = mtp.prompt_ids(16)
    assert rel_err(bare.forward(ids, 0), mtp.hf_logits(ids)) <= REL_TOL  # the trunk alone, as transformers runs it


@needs_llama_cpp
def test_mtp_file_is_llama_cpps_both_ways():
    """llama.cpp's converter's MTP file and Strata's: the same tensors and keys; each opens in the
    other program with the trunk's greedy path."""
    from gguf import GGUFReader

    mtp = zoo().get("mimo2mtp")
    theirs, ours = mtp.llama_cpp_gguf("f32"), mtp.gguf("f32")
    a, b = GGUFReader(theirs), GGUFReader(ours)
    assert sorted(t.name for t in a.tensors) == sorted(t.name for t in b.tensors)
    assert {k: v.contents() for k, v in a.fields.items() if k.startswith("mimo2.")} == \
        {k: v.contents() for k, v in b.fields.items() if k.startswith("mimo2.")}
    prompt = mtp.prompt_ids(16, seed=5)
    assert Bare(theirs).model.nextn.blocks[0].names == Bare(ours).model.nextn.blocks[0].names
    assert Bare(theirs).greedy(prompt, 16) == _greedy(_llama(ours), prompt, 16)


# -- 5. every path ---------------------------------------------------------------------------

def test_packed_compute_every_memory(tiny):
    check_packed_every_memory(tiny)


def test_fused_step_and_program_equal_the_per_call_path(tiny):
    """Every block fused, the decode program over all of them (the sliding layers read its second
    RoPE tables), bit for bit the per-call path, on the f32 and the default file."""
    for outtype in ("f32", None):
        with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                         memory="direct") as m:
            assert all(s is not None for s in m.runner.steps)
            assert m.plan.decode == "program" and m.runner.program is not None
            _check_fused_equals_per_call(tiny, m)


def test_default_file_tracks_float(tiny):
    ids = tiny.prompt_ids(40)
    with load(tiny.gguf(None)) as ref, load(tiny.gguf(None), "packed", "tiered") as tiered:
        a, b = ref.logits(ids), tiered.logits(ids)
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95


@pytest.mark.parametrize("key, value, says", [
    ("mimo2.attention.head_count_kv", ([1, 2, 2], "UINT32"), "one positive count per block"),
    ("mimo2.attention.head_count_kv", ([1, 3, 3, 1], "UINT32"), "divisors of head_count=4"),
    ("mimo2.attention.sliding_window_pattern", ([0, 1, 2, 0], "INT32"), "sliding_window_pattern"),
    ("mimo2.attention.value_scale", (0.0, None), "value_scale")])
def test_malformed_per_layer_keys_name_the_file_and_key(tiny, tmp_path, key, value, says):
    from gguf import GGUFValueType as V

    from strata.errors import StrataFormatError
    from tests.fixtures.rewrite import rewrite

    values, sub = value
    spec = (values, V.ARRAY, getattr(V, sub)) if sub else (values, V.FLOAT32)
    bad = rewrite(tiny.gguf("f32"), tmp_path / "bad.gguf", {key: spec})
    with pytest.raises(StrataFormatError, match=says) as err:
        open_model(bad)
    assert "bad.gguf" in str(err.value)
