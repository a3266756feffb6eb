"""Dequantization of GGML blocks with torch operations, on any device (the tiered memory's packed
slots on CUDA, where the native kernels cannot run).

Each format follows gguf-py's numpy arithmetic (`gguf.quants`, which the native scalar
reference `native/dequant_ref.c` follows too): products formed first there (d * sc, dmin * m) are
formed first here, every operation is a separate float32 torch kernel (nothing fused), so results
are bit-identical to `gguf.quants` and `strata.native.dequantize_into` for finite inputs. The
float32 result is rounded into the output dtype by `copy_` (round to nearest even, as the native
conversions).

Block layouts (bytes; "half" is little-endian float16, d is a half), one row per format:

    Q4_0     18: d | qs[16]                             x = d * (q - 8)
    Q4_1     20: d, m half | qs[16]                     x = d * q + m
    Q5_0     22: d | qh[4] | qs[16]                     x = d * (q5 - 16)
    Q5_1     24: d, m half | qh[4] | qs[16]             x = d * q5 + m
    Q8_0     34: d | i8 qs[32]                          x = q * d
    Q2_K     84: scales[16] | qs[64] | d, dmin half     x = (d * sc) * q2 - (dmin * mn)
    Q3_K    110: hmask[32] | qs[64] | scales[12] | d    x = (d * (sc - 32)) * (q2 - 4 * !h)
    Q4_K    144: d, dmin | scales[12] | qs[128]         x = (d * sc) * q4 - (dmin * mn)
    Q5_K    176: d, dmin | scales[12] | qh[32] | qs[128]
    Q6_K    210: ql[128] | qh[64] | i8 scales[16] | d   x = (d * sc) * (q6 - 32)
    MXFP4    17: e (E8M0) | qs[16] (E2M1 codes)         x = 2^(e-128) * 2 * e2m1(q)
    NVFP4    36: e[4] (UE4M3, one per 16) | qs[32]      x = ue4m3(e) / 2 * 2 * e2m1(q)
    TQ1_0    54: qs[48] | qh[4] (base-3 digits) | d     x = d * (t - 1)
    TQ2_0    66: qs[64] | d                             x = d * (q2 - 1)
    IQ4_NL   18: d | qs[16]                             x = d * kvalues[q]
    IQ4_XS  136: d | u16 sh | sl[4] | qs[128]           x = (d * (sc - 32)) * kvalues[q]
    IQ2_XXS  66: d | 8 x (grid u8[4] | u32 signs, s)    x = d * (0.5 + s) * 0.25 * grid * sign
    IQ2_XS   74: d | u16 qs[32] | scales[8]             x = d * (0.5 + s) * 0.25 * grid * sign
    IQ2_S    82: d | qs[32] | signs[32] | qh[8] | scales[8]      (as IQ2_XS; 10-bit grid index)
    IQ3_XXS  98: d | qs[64] | u32 signs, s [8]          x = d * (0.5 + s) * 0.5 * grid * sign
    IQ3_S   110: d | qs[64] | qh[8] | signs[32] | scales[4]      x = (d * (1 + 2s)) * grid * sign
    IQ1_S    50: d | qs[32] | u16 qh[8]                 x = (d * (2s + 1)) * (grid + delta)
    IQ1_M    56: qs[32] | qh[16] | u16 scales[4]        (as IQ1_S; d in the words' top nibbles)

Where a byte holds two 4-bit codes, a run of low nibbles comes first, then the high nibbles
(4-bit i-quant scales and IQ1_M's qh are the exception: low, then high nibble of each byte).
An i-quant grid index (8 bits, or 9-11 with bits from qh/u16 words) selects 8 lattice values (4
for IQ3); signs come as 7-bit indices into the even-parity sign table (IQ2_XXS, IQ2_XS, IQ3_XXS:
four in a u32 under its 4-bit scale s, or the top 7 bits of a u16) or as plain sign bytes (IQ2_S,
IQ3_S); delta is -1/8 where its bit is set, else +1/8. The grids, the sign table and the code
values (kvalues, E2M1, UE4M3) are gguf-py's own (`gguf.quants`), made into tensors at first use.
Products are formed left to right as written.
Dimension letters: N blocks, and the element index within a block.

Must not choose slots or move bytes between tiers: blocks in, values out.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import quants as gguf_quants

from strata.quant import GGMLType, block_size, ggml_type

_Consts = dict[tuple[str, str], torch.Tensor]
_CONSTS: _Consts = {}  # small index and shift tensors, made once per device


def _cached(name: str, device: torch.device, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    key = (name, str(device))
    t = _CONSTS.get(key)
    if t is None:
        t = make().to(device)
        if t.is_cuda:  # made on whichever stream is current; it may be read on any other one
            torch.cuda.synchronize(t.device)
        _CONSTS[key] = t
    return t


def _const(name: str, device: torch.device, values: list[int], shape: tuple[int, ...],
           dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    return _cached(name, device, lambda: torch.tensor(values, dtype=dtype).reshape(shape))


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """float16 field at byte `offset` of every block, as float32 [N, 1] (exact)."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, run: int) -> torch.Tensor:
    """[N, n] bytes -> [N, 2n] 4-bit codes: per run of `run` bytes, low nibbles then high ones."""
    n_blocks = qs.shape[0]
    shifts = _const("nibble", qs.device, [0, 4], (1, 1, 2, 1))
    q = (qs.reshape(n_blocks, -1, 1, run) >> shifts) & 15  # [N, n/run, 2, run]
    return q.reshape(n_blocks, -1)


def _bits(qh: torch.Tensor, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Bit b of byte j of `qh` [N, nb] as [N, 8, nb] (bit-major) or [N, nb, 8] (byte-major)."""
    shifts = _const(name, qh.device, list(range(8)), shape)
    return (qh.unsqueeze(1 if shape[1] == 8 else 2) >> shifts) & 1


# --- gguf-py's tables (format data) as float32 tensors made once per device; i-quant fields ---

def _grid(fmt: str, device: torch.device) -> torch.Tensor:
    """Lattice points of i-quant `fmt` (gguf.quants class name): float32 [G, 8] or [G, 4]."""
    def make() -> torch.Tensor:
        cls = getattr(gguf_quants, fmt)
        cls.init_grid()
        return torch.from_numpy(np.array(cls.grid, dtype=np.float32).reshape(cls.grid_shape))
    return _cached(f"grid_{fmt}", device, make)


def _sign_table(device: torch.device) -> torch.Tensor:
    """The 128 even-parity sign patterns (ksigns) as +-1.0 float32 [128, 8]: bit j set is -1."""
    def make() -> torch.Tensor:
        k = torch.from_numpy(np.frombuffer(gguf_quants.IQ2_XXS.ksigns, dtype=np.uint8).copy())
        return 1.0 - 2.0 * ((k.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1).float()
    return _cached("ksigns", device, make)


def _float_table(name: str, device: torch.device, values) -> torch.Tensor:
    return _cached(name, device, lambda: torch.from_numpy(np.asarray(values, dtype=np.float32).copy()))


def _lookup(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows of `table` [G, ...] at integer `idx` [...] -> [..., ...]."""
    return table.index_select(0, idx.reshape(-1).long()).reshape(*idx.shape, *table.shape[1:])


def _le(by: torch.Tensor) -> torch.Tensor:
    """Little-endian unsigned words from their bytes [..., size] -> int64 [...]."""
    size = by.shape[-1]
    shifts = _const(f"le{size}", by.device, [8 * i for i in range(size)], (size,), torch.long)
    return (by.long() << shifts).sum(-1)


def _pair_nibbles(s: torch.Tensor) -> torch.Tensor:
    """i-quant 4-bit scales [N, n] bytes -> [N, 2n]: low then high nibble of each byte."""
    shifts = _const("nibble_pair", s.device, [0, 4], (1, 1, 2))
    return ((s.unsqueeze(-1) >> shifts) & 15).reshape(s.shape[0], -1)


def _sign_bits(s: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Explicit sign bytes [N, n] -> +-1.0 [N, 8n] in `shape` (bit j of byte k is element 8k + j)."""
    return (1.0 - 2.0 * _bits(s, "bits_byte_major", (1, 1, 8)).float()).reshape(shape)


def _ksigns(idx: torch.Tensor) -> torch.Tensor:
    """7-bit indices into the even-parity sign table [...] -> +-1.0 [..., 8]."""
    return _lookup(_sign_table(idx.device), idx)


# --- Legacy and K-quants, MXFP4 ---

def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)  # [N, 1]
    q = _nibbles(b[:, 2:18], 16)  # [N, 32]
    return d * (q.float() - 8.0)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _half(b, 0), _half(b, 2)
    q = _nibbles(b[:, 4:20], 16)
    return d * q.float() + m


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1: bit j of the little-endian 32-bit qh is bit 4 of element j."""  # [N, 32]
    return _bits(qh, "bits_byte_major", (1, 1, 8)).reshape(qh.shape[0], 32) << 4


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)
    q = _nibbles(b[:, 6:22], 16) | _fifth_bits(b[:, 2:6])
    return d * (q.float() - 16.0)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _half(b, 0), _half(b, 2)
    q = _nibbles(b[:, 8:24], 16) | _fifth_bits(b[:, 4:8])
    return d * q.float() + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)
    return b[:, 2:34].contiguous().view(torch.int8).float() * d


def _k_2bit(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K/Q3_K 2-bit codes [N, 256]: element 128h + 32k + 16p + l is bits 2k of
    qs[32h + 16p + l] (h half, k shift, p parity of the 16-element sub-block, l in 0..15)."""
    n_blocks = qs.shape[0]
    shifts = _const("k2_shift", qs.device, [0, 2, 4, 6], (1, 1, 4, 1, 1))
    q = (qs.reshape(n_blocks, 2, 1, 2, 16) >> shifts) & 3  # [N, h, k, p, l]
    return q.reshape(n_blocks, 256)


def _per_sub(scale: torch.Tensor, q: torch.Tensor, sub: int) -> torch.Tensor:
    """scale [N, S] times codes [N, 256] in sub-blocks of `sub` elements -> [N, S, sub]."""
    return scale.unsqueeze(-1) * q.float().reshape(q.shape[0], -1, sub)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    scales = b[:, 0:16]
    d, dmin = _half(b, 80), _half(b, 82)
    dl = d * (scales & 15).float()  # [N, 16]
    ml = dmin * (scales >> 4).float()  # [N, 16]
    return _per_sub(dl, _k_2bit(b[:, 16:80]), 16) - ml.unsqueeze(-1)


def _q3_k_scales(s: torch.Tensor) -> torch.Tensor:
    """6-bit scales of the 16 sub-blocks, minus 32 [N, 16]: low 4 bits are nibble (j / 8) of
    s[j % 8], high 2 bits are bits 2 * (j / 4) of s[8 + j % 4]."""
    j = list(range(16))
    lo_idx = _const("q3_lo_idx", s.device, [i % 8 for i in j], (16,), torch.long)
    lo_sh = _const("q3_lo_sh", s.device, [4 * (i // 8) for i in j], (1, 16))
    hi_idx = _const("q3_hi_idx", s.device, [8 + i % 4 for i in j], (16,), torch.long)
    hi_sh = _const("q3_hi_sh", s.device, [2 * (i // 4) for i in j], (1, 16))
    lo = (s.index_select(1, lo_idx) >> lo_sh) & 15
    hi = (s.index_select(1, hi_idx) >> hi_sh) & 3
    return (lo | (hi << 4)).to(torch.int16) - 32


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    d = _half(b, 108)
    dl = d * _q3_k_scales(b[:, 96:108]).float()  # [N, 16]
    q2 = _k_2bit(b[:, 32:96]).to(torch.int16)  # [N, 256]
    # element 128h + 32k + 16p + l takes bit 4h + k of hmask[16p + l]
    shifts = _const("q3_hbit", b.device, [4 * h + k for h in range(2) for k in range(4)], (1, 2, 4, 1, 1))
    h = (b[:, 0:32].reshape(n_blocks, 1, 1, 2, 16) >> shifts) & 1  # [N, h, k, p, l]
    q = q2 - ((h.reshape(n_blocks, 256) ^ 1).to(torch.int16) << 2)
    return _per_sub(dl, q, 16)


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 6-bit scales and mins of the 8 sub-blocks from 12 bytes: [N, 8] each."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _q4_k_like(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    d, dmin = _half(b, 0), _half(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    d1 = d * sc.float()  # [N, 8]
    m1 = dmin * mn.float()  # [N, 8]
    return _per_sub(d1, q, 32) - m1.unsqueeze(-1)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _q4_k_like(b, _nibbles(b[:, 16:144], 32))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    high = _bits(b[:, 16:48], "bits_bit_major", (1, 8, 1)).reshape(n_blocks, 256)  # bit i/32 of qh[i%32]
    return _q4_k_like(b, _nibbles(b[:, 48:176], 32) | (high << 4))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    d = _half(b, 208)
    # element 128h + 32s + l: low 4 bits = nibble (s / 2) of ql[64h + 32(s % 2) + l],
    # high 2 bits = bits 2s of qh[32h + l]
    lo_sh = _const("q6_lo", b.device, [0, 4], (1, 1, 2, 1, 1))
    hi_sh = _const("q6_hi", b.device, [0, 2, 4, 6], (1, 1, 4, 1))
    lo = (b[:, 0:128].reshape(n_blocks, 2, 1, 2, 32) >> lo_sh) & 15  # [N, h, s/2, s%2, l]
    hi = (b[:, 128:192].reshape(n_blocks, 2, 1, 32) >> hi_sh) & 3  # [N, h, s, l]
    q = (lo.reshape(n_blocks, 2, 4, 32) | (hi << 4)).reshape(n_blocks, 256).to(torch.int16) - 32
    d1 = d * b[:, 192:208].contiguous().view(torch.int8).float()  # [N, 16]
    return _per_sub(d1, q, 16)


def _mxfp4(b: torch.Tensor) -> torch.Tensor:
    e = b[:, 0:1].to(torch.int32)  # [N, 1]
    # 2^(e - 128) as float32 bits: the subnormals 2^-128, 2^-127 for e < 2
    bits = torch.where(e < 2, torch.bitwise_left_shift(torch.full_like(e, 0x00200000), e), (e - 1) << 23)
    d = bits.view(torch.float32)
    lut = _float_table("e2m1x2", b.device, gguf_quants.MXFP4.kvalues)
    q = _nibbles(b[:, 1:17], 16)
    return d * _lookup(lut, q)


# --- Non-linear 4-bit, FP4 and ternary formats ---

def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 0)
    kv = _float_table("iq4_kvalues", b.device, gguf_quants.IQ4_NL.kvalues)
    return d * _lookup(kv, _nibbles(b[:, 2:18], 16))


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    d = _half(b, 0)
    # 6-bit scale of sub-block i: low nibble i of scales_l, high bits 2i of scales_h
    hi_sh = _const("iq4xs_hi", b.device, [2 * i for i in range(8)], (1, 8), torch.long)
    hi = (_le(b[:, 2:4]).unsqueeze(-1) >> hi_sh) & 3  # [N, 8]
    sc = (_pair_nibbles(b[:, 4:8]).long() | (hi << 4)) - 32
    dl = d * sc.float()  # [N, 8]
    kv = _float_table("iq4_kvalues", b.device, gguf_quants.IQ4_NL.kvalues)
    q = _lookup(kv, _nibbles(b[:, 8:136], 16))  # [N, 256]
    return dl.unsqueeze(-1) * q.reshape(n_blocks, 8, 32)


def _nvfp4(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    ue4m3 = _cached("ue4m3", b.device, lambda: torch.from_numpy(
        gguf_quants.NVFP4.ue4m3_to_fp32(np.arange(256, dtype=np.uint8)).astype(np.float32)))
    d = _lookup(ue4m3, b[:, 0:4]).unsqueeze(-1)  # [N, 4, 1], halved scale per 16 elements
    lut = _float_table("e2m1x2", b.device, gguf_quants.NVFP4.kvalues)
    q = _lookup(lut, _nibbles(b[:, 4:36], 8))  # [N, 64]
    return d * q.reshape(n_blocks, 4, 16)


def _tq1_0(b: torch.Tensor) -> torch.Tensor:
    """Five (four in qh) base-3 digits per byte: digit k of byte c is (c * 3^k mod 256) * 3 >> 8;
    digit k of qs[j] is element 32k + j (first 32 bytes), 160 + 16k + j (next 16), of qh[j]
    240 + 4k + j."""
    n_blocks = b.shape[0]
    pow3 = _const("pow3", b.device, [1, 3, 9, 27, 81], (1, 5, 1))
    parts = [b[:, 0:32].unsqueeze(1) * pow3, b[:, 32:48].unsqueeze(1) * pow3,
             b[:, 48:52].unsqueeze(1) * pow3[:, :4]]  # uint8 products wrap mod 256
    q = torch.cat([p.reshape(n_blocks, -1) for p in parts], dim=1).to(torch.int16)
    d = _half(b, 52)
    return d * (((q * 3) >> 8) - 1).float()


def _tq2_0(b: torch.Tensor) -> torch.Tensor:
    d = _half(b, 64)
    return d * (_k_2bit(b[:, 0:64]).to(torch.int16) - 1).float()


# --- Lattice (grid) i-quants ---

def _iq2_db(d: torch.Tensor, s: torch.Tensor, step: float) -> torch.Tensor:
    """IQ2/IQ3_XXS sub-block scales d * (0.5 + s) * step, from 4-bit `s` [N, S] -> [N, S, 1, 1]."""
    return (d * (0.5 + s.float()) * step).reshape(*s.shape, 1, 1)


def _iq2_xxs(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    sub = b[:, 2:66].reshape(n_blocks, 8, 8)  # [N, 8 sub-blocks of 32, grid bytes[4] | u32]
    aux = _le(sub[:, :, 4:8])  # [N, 8]: four 7-bit sign indices, 4-bit scale on top
    db = _iq2_db(_half(b, 0), aux >> 28, 0.25)
    sh = _const("ksign_sh", b.device, [0, 7, 14, 21], (1, 1, 4), torch.long)
    signs = _ksigns((aux.unsqueeze(-1) >> sh) & 127)  # [N, 8, 4, 8]
    grid = _lookup(_grid("IQ2_XXS", b.device), sub[:, :, 0:4])  # [N, 8, 4, 8]
    return db * grid * signs


def _iq2_xs(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    qs = _le(b[:, 2:66].reshape(n_blocks, 32, 2))  # [N, 32]: 9-bit grid index, 7-bit sign index
    db = _iq2_db(_half(b, 0), _pair_nibbles(b[:, 66:74]), 0.25)  # [N, 16, 1, 1]
    signs = _ksigns(qs >> 9).reshape(n_blocks, 16, 2, 8)
    grid = _lookup(_grid("IQ2_XS", b.device), qs & 511).reshape(n_blocks, 16, 2, 8)
    return db * grid * signs


def _iq2_s(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    db = _iq2_db(_half(b, 0), _pair_nibbles(b[:, 74:82]), 0.25)  # [N, 16, 1, 1]
    signs = _sign_bits(b[:, 34:66], (n_blocks, 16, 2, 8))
    # grid index k: qs[k] | bits 2 * (k % 4) of qh[k / 4] as bits 8-9
    sh = _const("k2_pair_sh", b.device, [0, 2, 4, 6], (1, 1, 4))
    hi = ((b[:, 66:74].unsqueeze(-1) >> sh) & 3).reshape(n_blocks, 32)
    idx = b[:, 2:34].long() | (hi.long() << 8)
    grid = _lookup(_grid("IQ2_S", b.device), idx).reshape(n_blocks, 16, 2, 8)
    return db * grid * signs


def _iq3_xxs(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    aux = _le(b[:, 66:98].reshape(n_blocks, 8, 4))  # [N, 8]
    db = _iq2_db(_half(b, 0), aux >> 28, 0.5)
    sh = _const("ksign_sh", b.device, [0, 7, 14, 21], (1, 1, 4), torch.long)
    signs = _ksigns((aux.unsqueeze(-1) >> sh) & 127)  # [N, 8, 4, 8]
    grid = _lookup(_grid("IQ3_XXS", b.device), b[:, 2:66]).reshape(n_blocks, 8, 4, 8)
    return db * grid * signs


def _iq3_s(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    d = _half(b, 0)
    db = (d * (1 + 2 * _pair_nibbles(b[:, 106:110]).long()).float()).reshape(n_blocks, 8, 1, 1)
    signs = _sign_bits(b[:, 74:106], (n_blocks, 8, 4, 8))
    hi = _bits(b[:, 66:74], "bits_byte_major", (1, 1, 8)).reshape(n_blocks, 64)  # bit k%8 of qh[k/8]
    idx = b[:, 2:66].long() | (hi.long() << 8)
    grid = _lookup(_grid("IQ3_S", b.device), idx).reshape(n_blocks, 8, 4, 8)
    return db * grid * signs


def _iq1_delta(bit: torch.Tensor) -> torch.Tensor:
    """+1/8 where the delta bit is clear, -1/8 where set."""
    return 0.125 - 0.25 * bit.float()


def _iq1_s(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    qh = _le(b[:, 34:50].reshape(n_blocks, 8, 2))  # [N, 8]: 4 x 3 grid bits, 3-bit scale, delta bit
    dl = (_half(b, 0) * (2 * ((qh >> 12) & 7) + 1).float()).reshape(n_blocks, 8, 1, 1)
    delta = _iq1_delta(qh >> 15).reshape(n_blocks, 8, 1, 1)
    sh = _const("iq1_sh", b.device, [0, 3, 6, 9], (1, 1, 4), torch.long)
    idx = b[:, 2:34].long() | (((qh.unsqueeze(-1) >> sh) & 7).reshape(n_blocks, 32) << 8)
    grid = _lookup(_grid("IQ1_S", b.device), idx).reshape(n_blocks, 8, 4, 8)
    return dl * (grid + delta)


def _iq1_m(b: torch.Tensor) -> torch.Tensor:
    n_blocks = b.shape[0]
    words = _le(b[:, 48:56].reshape(n_blocks, 4, 2))  # [N, 4]
    # float16 d: nibble m is the top nibble of word m
    d_sh = _const("iq1m_d_sh", b.device, [0, 4, 8, 12], (1, 4), torch.long)
    d_bits = ((words >> 12) << d_sh).sum(-1, keepdim=True)  # [N, 1]
    d = torch.cat([d_bits & 255, d_bits >> 8], dim=1).to(torch.uint8).view(torch.float16).float()
    sh = _const("iq1_sh", b.device, [0, 3, 6, 9], (1, 1, 4), torch.long)
    sc = ((words.unsqueeze(-1) >> sh) & 7).reshape(n_blocks, 16)  # 3-bit scale per 16 elements
    dl = (d * (2 * sc + 1).float()).reshape(n_blocks, 8, 2, 1, 1)
    qh = _pair_nibbles(b[:, 32:48]).long()  # [N, 32]: 3 grid bits, delta bit per 8 elements
    idx = b[:, 0:32].long() | ((qh & 7) << 8)
    delta = _iq1_delta(qh >> 3).reshape(n_blocks, 8, 2, 2, 1)
    grid = _lookup(_grid("IQ1_M", b.device), idx).reshape(n_blocks, 8, 2, 2, 8)
    return dl * (grid + delta)


_BLOCK_KERNELS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.Q4_0: _q4_0, GGMLType.Q4_1: _q4_1, GGMLType.Q5_0: _q5_0, GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0, GGMLType.Q2_K: _q2_k, GGMLType.Q3_K: _q3_k, GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k, GGMLType.Q6_K: _q6_k, GGMLType.MXFP4: _mxfp4, GGMLType.NVFP4: _nvfp4,
    GGMLType.TQ1_0: _tq1_0, GGMLType.TQ2_0: _tq2_0, GGMLType.IQ4_NL: _iq4_nl, GGMLType.IQ4_XS: _iq4_xs,
    GGMLType.IQ2_XXS: _iq2_xxs, GGMLType.IQ2_XS: _iq2_xs, GGMLType.IQ2_S: _iq2_s,
    GGMLType.IQ3_XXS: _iq3_xxs, GGMLType.IQ3_S: _iq3_s, GGMLType.IQ1_S: _iq1_s, GGMLType.IQ1_M: _iq1_m,
}
_FLOATS = {GGMLType.F32: torch.float32, GGMLType.F16: torch.float16, GGMLType.BF16: torch.bfloat16}

#: Formats this module dequantizes.
TORCH_DEQUANT_TYPES: tuple[GGMLType, ...] = (*_FLOATS, *_BLOCK_KERNELS)


def dequantize_into(t: GGMLType | int | str, src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Dequantize packed `src` (uint8 [>= packed bytes], same device as `out`) of ggml type `t`
    into `out` (float32/float16/bfloat16, contiguous, last dimension a multiple of the block
    size). Returns `out`."""
    t = ggml_type(t)
    if t not in TORCH_DEQUANT_TYPES:
        raise ValueError(f"torch dequantization of {t.name} is not supported "
                         f"(supported: {', '.join(x.name for x in TORCH_DEQUANT_TYPES)})")
    if src.dtype != torch.uint8 or src.dim() != 1 or src.device != out.device:
        raise ValueError(f"{t.name}: source must be a 1-D uint8 tensor on {out.device}, found "
                         f"{src.dtype} {list(src.shape)} on {src.device}")
    if not out.is_contiguous() or out.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{t.name}: output must be a contiguous float32/float16/bfloat16 tensor, found {out.dtype}")
    elems, nbytes = block_size(t)
    row_len = out.shape[-1] if out.dim() else 1
    if row_len % elems:
        raise ValueError(f"{t.name}: row length {row_len} of output {list(out.shape)} is not a multiple of "
                         f"the block size {elems}")
    n_blocks = out.numel() // elems
    need = n_blocks * nbytes
    if src.numel() < need:
        raise ValueError(f"{t.name}: output {list(out.shape)} needs {need} packed bytes, source holds {src.numel()}")
    packed = src[:need]
    if t in _FLOATS:
        values = packed.view(_FLOATS[t])
    else:
        values = _BLOCK_KERNELS[t](packed.view(n_blocks, nbytes))
    out.view(-1).copy_(values.reshape(-1))
    return out


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks of rows x [..., n] (n a multiple of 32) as uint8 [..., n / 32 * 34]: per block
    d = max|x| / 127, q = x * (1 / d) rounded half away from zero, d stored as a half; gguf-py's
    float32 operations in its order (and ggml's quantize_row_q8_0), so the bytes equal
    `gguf.quants.quantize(x, Q8_0)`'s."""
    elems, nbytes = block_size(GGMLType.Q8_0)
    if x.shape[-1] % elems:
        raise ValueError(f"Q8_0: row length {x.shape[-1]} of {list(x.shape)} is not a multiple of {elems}")
    blocks = x.float().reshape(-1, elems)  # [N, 32]
    d = blocks.abs().amax(dim=1, keepdim=True) / 127  # [N, 1]
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    y = blocks * inv
    a = y.abs()
    q = torch.sign(y) * (a.floor() + (2 * (a - a.floor())).floor())  # gguf-py's np_roundf
    out = torch.empty((blocks.shape[0], nbytes), dtype=torch.uint8, device=x.device)
    out[:, :2] = d.half().view(torch.uint8)
    out[:, 2:] = q.to(torch.int8).view(torch.uint8)
    return out.view(*x.shape[:-1], x.shape[-1] // elems * nbytes)


def dequantize_q8_0(b: torch.Tensor) -> torch.Tensor:
    """Rows of Q8_0 blocks b uint8 [..., nb * 34] as float32 [..., nb * 32] (x = q * d, exact)."""
    elems, nbytes = block_size(GGMLType.Q8_0)
    values = _q8_0(b.reshape(-1, nbytes))  # [N, 32]
    return values.view(*b.shape[:-1], b.shape[-1] // nbytes * elems)


__all__ = ["TORCH_DEQUANT_TYPES", "dequantize_into", "dequantize_q8_0", "quantize_q8_0"]
