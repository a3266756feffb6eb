"""DirectExpertMemory hands out exactly the file's expert weights, through a strict protocol."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from strata.gguf import open_model
from strata.memory import DirectExpertMemory, ExpertMemory
from tests.gguf import fixtures as gguf_fixtures


def _reference(path, name: str) -> np.ndarray:
    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    return dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))  # [E, rows, cols]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # random K-quant bytes
@pytest.mark.parametrize("writer, fused", [(gguf_fixtures.write_qwen3moe, False),
                                           (gguf_fixtures.write_qwen3moe_fused, True)])
def test_acquired_weights_equal_the_dequantized_tensor(tmp_path, writer, fused):
    path = tmp_path / "m.gguf"
    writer(path)
    mf = open_model(path)
    memory = DirectExpertMemory(mf, max_acquire=2)
    assert isinstance(memory, ExpertMemory)
    if fused:
        gate_up = _reference(path, "blk.1.ffn_gate_up_exps.weight")
        I = gate_up.shape[1] // 2
        gate, up = gate_up[:, :I], gate_up[:, I:]
    else:
        gate, up = _reference(path, "blk.1.ffn_gate_exps.weight"), _reference(path, "blk.1.ffn_up_exps.weight")
    down = _reference(path, "blk.1.ffn_down_exps.weight")
    weights = memory.acquire(1, [3, 0])
    for e, w in zip([3, 0], weights):
        for got, ref in ((w.gate, gate[e]), (w.up, up[e]), (w.down, down[e])):  # random K-quant bytes hold NaNs
            torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=0, equal_nan=True)
    memory.release(1, [3, 0])


def test_protocol_errors(tmp_path):
    path = tmp_path / "m.gguf"
    gguf_fixtures.write_qwen3moe(path)
    memory = DirectExpertMemory(open_model(path), max_acquire=2, dtype=torch.bfloat16)
    assert memory.acquire(0, [1])[0].gate.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="still held"):
        memory.acquire(0, [2])
    with pytest.raises(RuntimeError, match="does not match"):
        memory.release(0, [2])
    memory.release(0, [1])
    with pytest.raises(ValueError, match="max_acquire=2"):
        memory.acquire(0, [0, 1, 2])
    with pytest.raises(ValueError, match="out of range"):
        memory.acquire(0, [99])
