"""The metadata keys real MoE files carry beyond our own fixtures' (llama.cpp's converter and
loader): read and given their meaning, an unknown key ignored, a known key with a bad value a
one-line StrataFormatError naming the file, the key, what was expected and what was found."""
from __future__ import annotations

import math

import pytest

from strata.errors import StrataFormatError
from strata.gguf import open_model
from tests.fixtures.rewrite import V, rewrite


def _open(model_files, tmp_path, fixture: str, changes: dict, drop=frozenset()):
    path = rewrite(model_files[fixture][0], tmp_path / f"{fixture}.gguf", changes, drop)
    return path, open_model(path)


def test_unknown_keys_are_ignored(model_files, tmp_path):
    _, mf = _open(model_files, tmp_path, "qwen3moe", {
        "qwen3moe.some_future_key": (7, V.UINT32), "qwen3moe.rope.scaling.finetuned": (True, V.BOOL),
        "qwen3moe.attention.sliding_window": (4096, V.UINT32),  # llama.cpp's qwen3moe reads no window
        "vendor.note": ("hello", V.STRING)})
    with mf:
        assert mf.hparams.sliding_window == 0 and not any(mf.hparams.is_swa(i) for i in range(mf.hparams.n_layers))


@pytest.mark.parametrize("pattern, want", [
    (None, (True, False)),  # gpt-oss's default period 2: layer 0 slides
    ((3, V.UINT32), (True, True)),  # period 3 over 2 layers
    ((1, V.UINT32), (False, False)),  # period 1: no sliding layer
    ((0, V.UINT32), (True, True)),  # 0: every layer
    (([False, True], V.ARRAY, V.BOOL), (False, True)),  # one bool per layer
])
def test_sliding_window_pattern(model_files, tmp_path, pattern, want):
    changes = {} if pattern is None else {"gpt-oss.attention.sliding_window_pattern": pattern}
    _, mf = _open(model_files, tmp_path, "gpt-oss", changes)
    with mf:
        assert mf.hparams.swa_layers == want
        assert tuple(mf.hparams.is_swa(i) for i in range(2)) == want


def test_swa_rope_base_defaults_to_the_full_one(model_files, tmp_path):
    _, mf = _open(model_files, tmp_path, "gpt-oss", {})
    with mf:
        assert mf.hparams.rope_freq_base_swa == mf.hparams.rope_freq_base
    _, mf = _open(model_files, tmp_path, "gpt-oss", {"gpt-oss.rope.freq_base_swa": (10000.0, V.FLOAT32)})
    with mf:
        assert mf.hparams.rope_freq_base_swa == 10000.0 != mf.hparams.rope_freq_base


@pytest.mark.parametrize("value, want", [(0, "softmax"), (1, "softmax"), (2, "sigmoid"), (3, "softmax_weight")])
def test_gating_func_ids(model_files, tmp_path, value, want):
    """llama.cpp's ids; 0 ("none") is the architecture's default (deepseek2: softmax, as V2 files
    without the key mean)."""
    _, mf = _open(model_files, tmp_path, "deepseek2", {"deepseek2.expert_gating_func": (value, V.UINT32)})
    with mf:
        assert mf.hparams.expert_gating_func == want


def test_deepseek_temperature_keys(model_files, tmp_path):
    _, mf = _open(model_files, tmp_path, "deepseek2", {"deepseek2.attention.temperature_scale": (0.1, V.FLOAT32),
                                                        "deepseek2.attention.temperature_length": (8192, V.UINT32)})
    with mf:
        assert (mf.hparams.attn_temperature_scale, mf.hparams.attn_temperature_length) == (pytest.approx(0.1), 8192)


D, G, Q = "deepseek2.", "gpt-oss.", "qwen3moe."
YARN = {Q + "rope.scaling.type": ("yarn", V.STRING)}


@pytest.mark.parametrize("fixture, key, value, extra", [
    ("qwen3moe", Q + "rope.scaling.type", ("ntk", V.STRING), {}),
    ("qwen3moe", Q + "rope.scaling.factor", (-4.0, V.FLOAT32), YARN),
    ("qwen3moe", Q + "rope.scaling.attn_factor", (0.0, V.FLOAT32), {}),
    ("qwen3moe", Q + "rope.scaling.attn_factor", (-1.0, V.FLOAT32), {}),
    ("qwen3moe", Q + "rope.scaling.yarn_attn_factor", (math.nan, V.FLOAT32), YARN),
    ("qwen3moe", Q + "rope.scaling.yarn_beta_slow", (math.inf, V.FLOAT32), YARN),
    ("deepseek2", D + "expert_gating_func", (7, V.UINT32), {}),
    ("deepseek2", D + "expert_gating_func", (4, V.UINT32), {}),  # sqrt(softplus): not computed here
    ("deepseek2", D + "expert_group_count", (3, V.UINT32), {}),  # does not divide 4 experts
    ("deepseek2", D + "expert_group_count", (4, V.UINT32), {}),  # not fewer than the experts
    ("deepseek2", D + "expert_group_used_count", (2, V.UINT32), {}),  # not fewer than the 2 groups
    ("deepseek2", D + "attention.temperature_length", (0, V.UINT32), {D + "attention.temperature_scale": (0.1, V.FLOAT32)}),
    ("deepseek2", D + "attention.temperature_scale", (math.nan, V.FLOAT32), {D + "attention.temperature_length": (8, V.UINT32)}),
    ("gpt-oss", G + "attention.sliding_window", (0, V.UINT32), {}),
    ("gpt-oss", G + "attention.sliding_window_pattern", ([True, False, True], V.ARRAY, V.BOOL), {}),
    ("gpt-oss", G + "attention.sliding_window_pattern", ([1, 2], V.ARRAY, V.INT32), {}),  # 0/1 as mimo2's converter writes, not 2
    ("gpt-oss", G + "attention.sliding_window_pattern", (-2, V.INT32), {}),
    ("gpt-oss", G + "rope.freq_base_swa", (-10000.0, V.FLOAT32), {}),
])
def test_bad_values_are_one_line_errors(model_files, tmp_path, fixture, key, value, extra):
    path = rewrite(model_files[fixture][0], tmp_path / "bad.gguf", {**extra, key: value})
    with pytest.raises(StrataFormatError) as e:
        open_model(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: metadata key '{key}': expected "), msg
    assert "found" in msg and "\n" not in msg, msg


def test_missing_temperature_length_is_named(model_files, tmp_path):
    path = rewrite(model_files["deepseek2"][0], tmp_path / "bad.gguf", {D + "attention.temperature_scale": (0.1, V.FLOAT32)})
    with pytest.raises(StrataFormatError, match="attention.temperature_length.*no such key"):
        open_model(path)
