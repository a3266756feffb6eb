"""Every expert slab is exactly expert e's slice of its 3-D tensor, as gguf-py's reader sees it."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from strata.gguf import PARTS, open_model

from .fixtures import WRITERS


def _reader_expert_bytes(tensor, expert: int, part: str, fused: bool) -> bytes:
    rows = np.ascontiguousarray(tensor.data[expert])  # [rows, row_bytes] (or [rows, cols] for floats)
    if fused and part != "down":  # [2I, H]: gate rows first, then up rows
        half = rows.shape[0] // 2
        rows = rows[:half] if part == "gate" else rows[half:]
    return rows.tobytes()


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_slab_equals_the_readers_slice(model_files, name):
    path, expected = model_files[name]
    reader = {t.name: t for t in GGUFReader(path).tensors}
    H, I = expected["n_embd"], expected["n_ff_exp"]
    with open_model(path) as mf:
        n_checked = 0
        for layer in mf.expert_layers:
            fused = mf.is_fused(layer)
            assert fused == (name == "qwen3moe-fused")
            for expert in range(mf.hparams.n_experts):
                for part in PARTS:
                    slab = mf.expert(layer, expert, part)
                    assert (slab.layer, slab.expert, slab.part) == (layer, expert, part)
                    assert slab.shape == ((H, I) if part == "down" else (I, H))
                    assert slab.ggml_type == mf.tensors[slab.tensor].ggml_type
                    want = _reader_expert_bytes(reader[slab.tensor], expert, part, fused)
                    assert mf.expert_data(slab).tobytes() == want
                    n_checked += 1
        assert n_checked == len(mf.expert_layers) * mf.hparams.n_experts * 3


@pytest.mark.parametrize("name", ["qwen3moe", "qwen3moe-fused"])
def test_slabs_tile_their_tensors(model_files, name):
    with open_model(model_files[name][0]) as mf:
        for layer in mf.expert_layers:
            spans = sorted((s.offset, s.offset + s.nbytes) for e in range(mf.hparams.n_experts)
                           for s in mf.expert_slabs(layer, e))
            tensors = {s.tensor for s in mf.expert_slabs(layer, 0)}
            assert sum(end - start for start, end in spans) == sum(mf.tensors[t].nbytes for t in tensors)
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_fused_gate_and_up_are_adjacent_halves(model_files):
    with open_model(model_files["qwen3moe-fused"][0]) as mf:
        gate, up, down = mf.expert_slabs(1, 2)
        assert gate.tensor == up.tensor == "blk.1.ffn_gate_up_exps.weight"
        assert gate.offset + gate.nbytes == up.offset and gate.nbytes == up.nbytes
        t = mf.tensors[gate.tensor]
        assert gate.offset == t.offset + 2 * t.nbytes // mf.hparams.n_experts
        assert down.tensor == "blk.1.ffn_down_exps.weight"
