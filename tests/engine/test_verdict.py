"""`strata inspect`'s verdict line and `strata.load` say the same sentence about a file that will
not run (the tensor and type, the architecture or the tokenizer), and how a file that runs does."""
from __future__ import annotations

from dataclasses import replace

import pytest

import strata
from strata.cli import main
from strata import native
from strata.engine.verdict import verdict
from strata.errors import StrataError
from strata.gguf import open_model
from tests.gguf.fixtures import Dims, ModelWriter, Q, _attention, _common_keys, _embeddings


def _write(path, down=Q.Q8_0, gate_up=Q.Q4_K, arch="qwen3moe", pre=None):
    """A two-layer qwen3moe-shaped file whose experts are of the given types."""
    d = Dims()
    mw = ModelWriter(path, arch, seed=5)
    _common_keys(mw, d)
    mw.w.add_expert_feed_forward_length(d.n_ff_exp)
    mw.w.add_key_length(d.head_dim)
    mw.w.add_value_length(d.head_dim)
    mw.drop_keys({"tokenizer.ggml.tokens", "tokenizer.ggml.scores"})  # a BPE with one real merge
    mw.w.add_token_list(["a", "b", "ab"] + [f"tok{i}" for i in range(3, d.vocab)])
    mw.w.add_token_merges(["a b"])
    if pre is not None:
        mw.w.add_tokenizer_pre(pre)
    _embeddings(mw, d)
    for i in range(d.n_layers):
        _attention(mw, d, i)
        mw.f32(f"blk.{i}.attn_q_norm.weight", d.head_dim)
        mw.f32(f"blk.{i}.attn_k_norm.weight", d.head_dim)
        mw.f32(f"blk.{i}.ffn_norm.weight", d.n_embd)
        mw.f32(f"blk.{i}.ffn_gate_inp.weight", d.n_experts, d.n_embd)
        mw.quant(f"blk.{i}.ffn_gate_exps.weight", gate_up, d.n_experts, d.n_ff_exp, d.n_embd)
        mw.quant(f"blk.{i}.ffn_up_exps.weight", gate_up, d.n_experts, d.n_ff_exp, d.n_embd)
        mw.quant(f"blk.{i}.ffn_down_exps.weight", down, d.n_experts, d.n_embd, d.n_ff_exp)
    return mw.finish()


def _inspect(capsys, path, *args):
    code = main(["inspect", str(path), *args])
    return code, capsys.readouterr().out


def test_a_file_that_runs_says_how(tmp_path, capsys):
    path = _write(tmp_path / "ok.gguf")
    with open_model(path) as mf:
        v = verdict(mf, "packed")
        f = verdict(mf, "float")
    assert v.runs and f.runs
    assert v.sentence.startswith("runs: qwen3moe, packed compute")
    assert set(v.kernels) == {"F32", "Q8_0", "Q4_K"} and v.kernels["Q4_K"] in ("avx512", "avx2", "scalar")
    assert "float compute" in f.sentence
    code, out = _inspect(capsys, path)
    assert code == 0 and f"verdict: {v.sentence}" in out.splitlines()[:6]


def test_unreadable_type_names_tensor_and_type_in_inspect_and_load(tmp_path, capsys):
    path = _write(tmp_path / "q8_1.gguf", down=Q.Q8_1)  # a type llama.cpp uses for activations only
    with open_model(path) as mf:
        v = verdict(mf, "packed")
    assert not v.runs
    assert v.sentence.startswith("does not run: tensor 'blk.0.ffn_down_exps.weight' is Q8_1, a ggml type Strata "
                                 "cannot read")
    assert "Q4_K" in v.sentence  # the list of what it reads
    code, out = _inspect(capsys, path)
    assert code == 0 and f"verdict: {v.sentence}" in out.splitlines()[:6]
    for compute in ("packed", "float"):
        with pytest.raises(StrataError) as e:
            strata.load(path, compute=compute, threads=1, n_ctx=64)
        assert str(e.value) == f"{path}: {v.sentence}"
        assert "\n" not in str(e.value) and "status" not in str(e.value)


def test_type_without_packed_kernel_says_use_float(tmp_path, monkeypatch):
    """As a type with dequantization but no packed kernel would be (every type has both today)."""
    path = _write(tmp_path / "ok.gguf")
    real = native.type_support
    monkeypatch.setattr(native, "type_support", lambda t: replace(real(t), packed=False) if t == Q.Q4_K else real(t))
    with open_model(path) as mf:
        v = verdict(mf, "packed")
        assert verdict(mf, "float").runs
    assert not v.runs
    assert v.sentence.startswith("does not run: expert tensor 'blk.0.ffn_gate_exps.weight' is Q4_K, which has no "
                                 "packed kernels")
    assert "compute='float'" in v.sentence


def test_unknown_architecture(tmp_path, capsys):
    path = _write(tmp_path / "arch.gguf", arch="qwen3moe")
    with open_model(path) as mf:
        object.__setattr__(mf.hparams, "arch", "grok")  # an architecture Strata reads but does not run
        v = verdict(mf, "packed")
    assert not v.runs and v.sentence.startswith("does not run: architecture 'grok' is not supported")
    assert "qwen3moe" in v.sentence


def test_tokenizer_problem_is_the_verdict(tmp_path, capsys):
    path = _write(tmp_path / "pre.gguf", pre="no-such-pre-tokenizer")
    with open_model(path) as mf:
        v = verdict(mf, "packed")
    assert not v.runs and v.sentence.startswith("does not run: ") and "no-such-pre-tokenizer" in v.sentence
    code, out = _inspect(capsys, path)
    assert code == 0 and f"verdict: {v.sentence}" in out.splitlines()[:6]
