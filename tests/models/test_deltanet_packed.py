"""Packed compute stacks a gated DeltaNet layer's input projections (qkv, gate, beta/alpha) and a
gated attention layer's q/k/v into one matrix each: one product per layer instead of three or four.
The stacked product splits into the same tensors as the separate matrices give, in both beta/alpha
layouts (qwen3next: wba per key head; qwen35moe: beta and alpha apart). Packed decode steps (the
gated attention's in the native decode attention) equal the float path's."""
from __future__ import annotations

import pytest
import torch


import strata
from strata.models.kinds import native_classes
from strata.models.deltanet import GatedAttention, GatedDeltaNet
from strata.models.packed import PackedMatrix
from tests.fixtures.tiny import zoo

from .helpers import packed_decode_error, rel_err


def _rows(m: PackedMatrix, r0: int, r1: int) -> PackedMatrix:
    """Rows r0:r1 of a packed matrix, as a matrix of their own."""
    return PackedMatrix(m.data.reshape(-1)[r0 * m.row_bytes:r1 * m.row_bytes], m.type, (r1 - r0, m.shape[1]),
                        m.compute)


def _unstack(net: GatedDeltaNet) -> None:
    """Give `net` the separate matrices its stacked w_in holds, and drop w_in."""
    w, value = net.w, net.hv * net.dv
    C = w.w_in.shape[0] - value - 2 * net.hv
    cuts = [0, C, C + value, C + value + net.hv, C + value + 2 * net.hv]
    parts = [_rows(w.w_in, a, b) for a, b in zip(cuts, cuts[1:])]
    w.wqkv, w.wgate = parts[0], parts[1]
    if w.w_in_ba:
        w.wba = _rows(w.w_in, cuts[2], cuts[4])
    else:
        w.wbeta, w.walpha = parts[2], parts[3]
    w.w_in = None


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_stacked_projections_split_as_the_separate_ones(arch):
    tiny = zoo().get(arch)
    with strata.load(tiny.gguf("q8_0"), compute="packed", threads=1, n_ctx=64, max_batch=1) as m:
        blocks = m.transformer.blocks
        nets = [b.attention for b in blocks if isinstance(b.attention, GatedDeltaNet)]
        atts = [b.attention for b in blocks if isinstance(b.attention, GatedAttention)]
        assert nets and atts
        for net in nets:
            w = net.w
            assert isinstance(w.w_in, PackedMatrix) and w.w_in_ba == (arch == "qwen3next")
            assert w.wqkv is None and w.wgate is None and w.wba is None and w.wbeta is None and w.walpha is None
        assert all(isinstance(a.w.wqkv, PackedMatrix) and a.w.wq is None for a in atts)
        x = torch.randn(5, nets[0].w.w_in.shape[1], generator=torch.Generator().manual_seed(0))
        stacked = nets[0].project(x)
        _unstack(nets[0])
        separate = nets[0].project(x)
        assert stacked[0].is_contiguous()
        for got, want in zip(stacked, separate):
            assert got.shape == want.shape and torch.equal(got, want)
        # the whole model gives the same logits with the layer stacked or not
        ids = tiny.prompt_ids(9)
        got = m.logits(ids)
    with strata.load(tiny.gguf("q8_0"), compute="packed", threads=1, n_ctx=64, max_batch=1) as m2:
        assert torch.equal(m2.logits(ids), got)


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_packed_decode_steps_equal_the_float_path(arch):
    """Every decode step of packed compute (DeltaNet kernels, stacked products, the gated
    attention's native decode attention) equals the float path within 1e-5."""
    def native_attention(bare):
        assert all(type(b.attention) in native_classes() for b in bare.model.blocks)

    assert packed_decode_error(zoo().get(arch), 16, native_attention) < 1e-5


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_decode_program_equals_the_float_path(arch):
    """The decode program over every block (the DeltaNet half and the gated attention each in one
    native step) decodes a batch of two sequences within 1e-5 of the float path."""
    from strata import runtime
    tiny = zoo().get(arch)
    prompts = [tiny.prompt_ids(12, seed=1), tiny.prompt_ids(7, seed=2)]
    runs = {}
    for compute in ("float", "packed"):
        with strata.load(tiny.gguf("f32"), compute=compute, threads=1, n_ctx=64, max_batch=2,
                         memory="direct") as m:
            assert m.plan.decode == (runtime.PROGRAM if compute == "packed" else runtime.FLOAT)
            slots = [m.cache.allocate() for _ in prompts]
            last = [int(m.runner(torch.tensor(p), m.cache.batch([s], [0], [len(p)]), m.cache)[0].argmax())
                    for s, p in zip(slots, prompts)]
            starts, steps = [len(p) for p in prompts], []
            for i in range(8):
                logits = m.runner(torch.tensor(last), m.cache.batch(slots, starts, [1, 1]), m.cache)  # [2, V]
                steps.append(logits)
                # the float path's choices drive both runs
                last = runs["float"][i].argmax(-1).tolist() if compute == "packed" else logits.argmax(-1).tolist()
                starts = [s + 1 for s in starts]
            runs[compute] = steps
    assert max(rel_err(b, a) for a, b in zip(runs["float"], runs["packed"])) < 1e-5
