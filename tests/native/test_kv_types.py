"""KV caches in F16, BF16 and Q8_0 (`--kv-type`): the native write rounds as torch (halves) and as
gguf.quants (Q8_0, byte for byte), the torch quantizer the float path writes with gives the same
bytes, and decode attention over such a cache, on the scalar and the AVX2 kernels, equals the F32
kernel over the dequantized cache bit for bit and matches a torch reference closely."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from strata import native
from strata.models import Batch
from strata.models.attention import Attention, attend_sinks
from strata.models.batch import read_values
from strata.quant_torch import dequantize_q8_0, quantize_q8_0

IMPLS = ["scalar", pytest.param("avx2", marks=pytest.mark.skipif(
    not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C"))]
#: cache storage dtype of each kv type and the row length (elements) of hd values
STORE = {"f16": torch.float16, "bf16": torch.bfloat16, "q8_0": torch.uint8}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rows(n: int, hd: int, seed: int) -> torch.Tensor:
    """Rows with a spread of magnitudes per block, exact zeros and ties of the rounding."""
    x = torch.randn(n, hd, generator=_gen(seed)) * torch.logspace(-3, 2, n)[:, None]
    x[0, :32] = 0  # an all-zero block: d = 0
    x[1, :32] = torch.arange(32) - 15.5  # max 16.5: x / d lands on .5 ties
    return x


def _row(kv_type: str, hd: int) -> int:
    return hd // 32 * 34 if kv_type == "q8_0" else hd


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_type", ["q8_0", "f16", "bf16"])
def test_kv_write_rounds_as_gguf_and_torch(kv_type, impl):
    T, Hkv, hd, S, C = 24, 2, 64, 3, 16
    x = _rows(T * 2 * Hkv, hd, seed=1).view(T, 2 * Hkv, hd)
    k, v = x[:, :Hkv], x[:, Hkv:]
    k_cache = torch.zeros(S, Hkv, C, _row(kv_type, hd), dtype=STORE[kv_type])
    v_cache = torch.zeros_like(k_cache)
    slots, positions = torch.arange(T) % S, torch.arange(T) // S
    native.kv_write(k, v, k_cache, v_cache, slots, positions, impl=impl)
    got_k, got_v = k_cache[slots, :, positions], v_cache[slots, :, positions]  # [T, Hkv, row]
    if kv_type == "q8_0":
        want = quants.quantize(x.numpy(), GGMLQuantizationType.Q8_0)  # [T, 2 Hkv, 68]
        got = torch.cat((got_k, got_v), 1).numpy()
        assert np.array_equal(got, want)
        assert np.array_equal(quantize_q8_0(x).numpy(), want)  # the float path's writer
        back = quants.dequantize(want, GGMLQuantizationType.Q8_0)
        assert np.array_equal(dequantize_q8_0(torch.from_numpy(want)).numpy(), back)
    else:
        assert torch.equal(got_k, k.to(STORE[kv_type])) and torch.equal(got_v, v.to(STORE[kv_type]))


def test_q8_0_rows_refuse_a_width_off_the_blocks():
    k = torch.randn(1, 1, 48)
    cache = torch.zeros(1, 1, 4, 51, dtype=torch.uint8)
    with pytest.raises(ValueError, match="kv_write"):
        native.kv_write(k, k, cache, cache, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))


def _quantized_pool(kv_type: str, starts, Hkv: int, hd: int, seed: int):
    """A paged pool of `kv_type` rows holding random keys and values of the sequences at `starts`
    (written by the native kv_write), its batch, and the same pool dequantized to float32."""
    P, B = 16, len(starts)
    n_each = -(-(max(starts) + 1) // P)
    order = torch.randperm(B * n_each, generator=_gen(seed)).tolist()
    tables = [order[b * n_each:(b + 1) * n_each] for b in range(B)]
    k_pool = torch.zeros(B * n_each, Hkv, P, _row(kv_type, hd), dtype=STORE[kv_type])
    v_pool = torch.zeros_like(k_pool)
    for b, s in enumerate(starts):
        fill = Batch.make([tables[b]], [0], [s + 1], P)
        kv = torch.randn(s + 1, 2 * Hkv, hd, generator=_gen(seed + b)) * 2
        native.kv_write(kv[:, :Hkv], kv[:, Hkv:], k_pool, v_pool, fill.token_blocks, fill.token_offsets)
    batch = Batch.make(tables, starts, [1] * B, P)
    return k_pool, v_pool, batch, read_values(k_pool, torch.float32), read_values(v_pool, torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_type", ["q8_0", "f16", "bf16"])
@pytest.mark.parametrize("H,Hkv,hd,starts", [(4, 2, 64, (0, 5, 37, 300)), (8, 1, 128, (15, 16, 700)),
                                             (2, 2, 32, (3, 255, 256))])
def test_attn_decode_over_typed_cache_is_f32_over_its_values(kv_type, impl, H, Hkv, hd, starts):
    """The native kernel reads the blocks themselves: the F32 kernel over the dequantized pool
    gives the same bytes, and a torch reference (SDPA) over the dequantized blocks agrees closely."""
    k_pool, v_pool, batch, k_f32, v_f32 = _quantized_pool(kv_type, starts, Hkv, hd, seed=hd + H)
    B = len(starts)
    q = torch.randn(B, H, hd, generator=_gen(H))
    scale, n_ctx = 1 / math.sqrt(hd), batch.positions + 1
    out, flat = torch.empty(B, H * hd), torch.empty(B, H * hd)
    native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, scale, out, impl=impl)
    native.attn_decode(q, k_f32, v_f32, batch.block_table, n_ctx, scale, flat, impl=impl)
    assert torch.equal(out, flat)
    want = Attention.attend_decode(None, q, batch, k_pool, v_pool)  # reads the blocks dequantized
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("impl", IMPLS)
def test_attn_decode_q8_0_sinks_and_window_match_the_torch_path(impl):
    H, Hkv, hd, starts = 8, 2, 32, (0, 4, 40, 299)
    k_pool, v_pool, batch, _, _ = _quantized_pool("q8_0", starts, Hkv, hd, seed=5)
    q = torch.randn(len(starts), H, hd, generator=_gen(6)) * 2
    sinks, scale = torch.linspace(-3, 3, H), 1 / math.sqrt(hd)
    for window in (0, 5, 128):
        want = attend_sinks(q, batch, k_pool, v_pool, sinks, window, scale)
        out = torch.empty(len(starts), H * hd)
        native.attn_decode(q, k_pool, v_pool, batch.block_table, batch.positions + 1, scale, out, impl=impl,
                           sinks=sinks, window=window)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_torch_write_and_native_write_give_the_same_q8_0_blocks():
    """The float path (Batch.write, torch) and the native path (kv_write) store equal bytes, so a
    prefix cached by one is read identically by the other."""
    Hkv, hd, T = 2, 64, 20
    batch = Batch.make([[2, 0]], [0], [T], 16)
    x = _rows(T * Hkv, hd, seed=3).view(T, Hkv, hd)
    a = torch.zeros(3, Hkv, 16, 68, dtype=torch.uint8)
    b = torch.zeros_like(a)
    batch.write(a, x)
    native.kv_write(x, x, b, b.clone(), batch.token_blocks, batch.token_offsets)
    assert torch.equal(a, b)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_type", ["f32", "q8_0", "f16"])
def test_attn_decode_on_a_pool_is_the_serial_calls_bytes(kv_type, impl):
    """The fused step's decode attention spreads (sequence, head) pairs over the compute pool when
    the work is large (here 8 heads of 128 over up to 700 positions: pooled) and computes each head
    whole on one thread: the bytes of the serial call, with and without a window and sinks; and
    small work (one short sequence) runs serially, also the same bytes."""
    H, Hkv, hd, starts = 8, 2, 128, (15, 300, 700)
    if kv_type == "f32":
        k_pool, v_pool, batch, _, _ = _quantized_pool("f16", starts, Hkv, hd, seed=9)
        k_pool, v_pool = read_values(k_pool, torch.float32), read_values(v_pool, torch.float32)
    else:
        k_pool, v_pool, batch, _, _ = _quantized_pool(kv_type, starts, Hkv, hd, seed=9)
    B = len(starts)
    q = torch.randn(B, H, hd, generator=_gen(3))
    n_ctx, sinks = batch.positions + 1, torch.randn(H, generator=_gen(4))
    with native.ComputePool(2) as pool:
        for kw in ({}, {"window": 128, "sinks": sinks}):
            serial, pooled = torch.empty(B, H * hd), torch.empty(B, H * hd)
            native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, serial, impl=impl, **kw)
            native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, pooled, impl=impl, pool=pool,
                               **kw)
            assert torch.equal(serial, pooled), kw
        one, one_pooled = torch.empty(1, H * hd), torch.empty(1, H * hd)
        for out, p in ((one, None), (one_pooled, pool)):
            native.attn_decode(q[:1], k_pool, v_pool, batch.block_table[:1], n_ctx[:1], hd ** -0.5, out, impl=impl,
                               pool=p)
        assert torch.equal(one, one_pooled)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_attn_decode_one_long_sequence_split_over_a_pool_is_the_serial_calls_bytes(kv_type, impl):
    """A sequence with fewer kv heads than threads spreads its positions over the pool (pieces whose
    partial softmaxes are merged in position order afterwards): the bytes of the serial call, which
    merges the same pieces as it goes, for lengths around the piece sizes, with a window and sinks,
    and with Llama 4's chunks; each also equals the same sequence batched with another (the split
    depends on a sequence's own length only)."""
    H, Hkv, hd, starts = 4, 1, 128, (1500, 31, 32, 33, 530, 4100)
    if kv_type == "f32":
        k_pool, v_pool, batch, _, _ = _quantized_pool("f16", starts, Hkv, hd, seed=13)
        k_pool, v_pool = read_values(k_pool, torch.float32), read_values(v_pool, torch.float32)
    else:
        k_pool, v_pool, batch, _, _ = _quantized_pool(kv_type, starts, Hkv, hd, seed=13)
    q = torch.randn(len(starts), H, hd, generator=_gen(7))
    n_ctx, sinks = batch.positions + 1, torch.randn(H, generator=_gen(8))
    with native.ComputePool(2) as two, native.ComputePool(3) as three:
        for kw in ({}, {"window": 300, "sinks": sinks}, {"chunk": 256}):
            pair = torch.empty(2, H * hd)
            native.attn_decode(q[[0, 4]], k_pool, v_pool, batch.block_table[[0, 4]], n_ctx[[0, 4]], hd ** -0.5, pair,
                               impl=impl, pool=three, **kw)
            for b in range(len(starts)):
                outs = []
                for p in (None, two, three):
                    out = torch.empty(1, H * hd)
                    native.attn_decode(q[b:b + 1], k_pool, v_pool, batch.block_table[b:b + 1], n_ctx[b:b + 1],
                                       hd ** -0.5, out, impl=impl, pool=p, **kw)
                    outs.append(out)
                assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), (kw, starts[b])
                if b in (0, 4):
                    assert torch.equal(outs[0][0], pair[0 if b == 0 else 1]), (kw, starts[b])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_attn_decode_heads_grouped_or_alone_give_the_same_bytes(kv_type, impl):
    """Query heads that share a kv head go through the cache together (in groups of at most 8, and
    a pool's range may cut a group): each head's bytes equal the head computed alone, serially and
    on pools of 2 and 3 threads (ranges that cut the 12 heads of one kv head mid-group)."""
    H, Hkv, hd, starts = 12, 1, 64, (700, 40)
    k_pool, v_pool, batch, k32, v32 = _quantized_pool("f16" if kv_type == "f32" else kv_type, starts, Hkv, hd, seed=21)
    if kv_type == "f32":
        k_pool, v_pool = k32, v32
    B = len(starts)
    q = torch.randn(B, H, hd, generator=_gen(5))
    n_ctx, sinks = batch.positions + 1, torch.randn(H, generator=_gen(6))
    for kw in ({}, {"window": 100, "sinks": sinks}):
        alone = torch.empty(B, H * hd)
        for h in range(H):
            one = torch.empty(B, hd)
            head_kw = dict(kw, sinks=sinks[h:h + 1]) if "sinks" in kw else kw
            native.attn_decode(q[:, h:h + 1].contiguous(), k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, one,
                               impl=impl, **head_kw)
            alone[:, h * hd:(h + 1) * hd] = one
        for threads in (None, 2, 3):
            out = torch.empty(B, H * hd)
            if threads is None:
                native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, out, impl=impl, **kw)
            else:
                with native.ComputePool(threads) as pool:
                    native.attn_decode(q, k_pool, v_pool, batch.block_table, n_ctx, hd ** -0.5, out, impl=impl,
                                       pool=pool, **kw)
            assert torch.equal(out, alone), (kw, threads)
