"""Hyperparameters that would crash the forward pass or silently produce garbage (NaN, infinite,
zero or negative scales; a rotary dimension the heads cannot hold) are refused at open, with the
file, the key, what was expected and what was found."""
from __future__ import annotations

import math

import pytest

from strata.errors import StrataFormatError
from strata.gguf import open_model
from tests.fixtures.rewrite import V, rewrite

A = "qwen3moe."
YARN = {A + "rope.scaling.type": ("yarn", V.STRING)}


@pytest.mark.parametrize("key, value, vtype, extra", [
    *[("rope.freq_base", v, V.FLOAT32, {}) for v in (math.nan, math.inf, 0.0, -1.0)],
    *[("attention.layer_norm_rms_epsilon", v, V.FLOAT32, {}) for v in (math.nan, -math.inf, 0.0, -0.5)],
    *[("expert_weights_scale", v, V.FLOAT32, {}) for v in (math.nan, math.inf, 0.0, -2.5)],
    *[("rope.scaling.factor", v, V.FLOAT32, YARN) for v in (-1.0, math.nan, math.inf)],
    *[("rope.scaling.original_context_length", v, V.INT32, YARN) for v in (0, -4096)],
    ("rope.scaling.yarn_ext_factor", math.nan, V.FLOAT32, YARN),
    ("rope.scaling.yarn_beta_fast", math.inf, V.FLOAT32, YARN),
    *[("rope.dimension_count", v, V.INT32, {}) for v in (63, -2, 0, 128)],
    ("attention.head_count_kv", 3, V.UINT32, {}),
])
def test_bad_values_are_refused_at_open(model_files, tmp_path, key, value, vtype, extra):
    src = model_files["qwen3moe"][0]
    bad = rewrite(src, tmp_path / "bad.gguf", {**extra, A + key: (value, vtype)})
    with pytest.raises(StrataFormatError) as e:
        open_model(bad)
    msg = str(e.value)
    assert msg.startswith(f"{bad}: metadata key '{A}{key}': expected "), msg
    assert repr(value) in msg or str(value) in msg, msg


def test_good_yarn_values_open(model_files, tmp_path):
    src = model_files["qwen3moe"][0]
    ok = rewrite(src, tmp_path / "ok.gguf", {**YARN, A + "rope.scaling.factor": (4.0, V.FLOAT32),
                                             A + "rope.scaling.original_context_length": (128, V.UINT32),
                                             A + "rope.dimension_count": (32, V.UINT32)})
    with open_model(ok) as mf:
        assert mf.hparams.rope_scaling.factor == 4.0 and mf.hparams.rope_dim == 32
