"""Dequantization of GGML blocks with torch operations, on any device (the device tier's packed
slots on CUDA, where the native kernels cannot run).

Each format follows the native scalar reference (`native/dequant_ref.c`), which follows gguf-py's
numpy arithmetic: products formed first there (d * sc, dmin * m) are formed first here, every
operation is a separate float32 torch kernel (nothing fused), so results are bit-identical to
`strata.native.dequantize_into` and `gguf.quants` for finite inputs. The float32 result is
rounded into the output dtype by `copy_` (round to nearest even, as the native conversions).

Block layouts (bytes; "half" is little-endian float16), one row per format:

    Q4_0   18: d half | qs[16]                       x = d * (q - 8)
    Q4_1   20: d, m half | qs[16]                    x = d * q + m
    Q5_0   22: d half | qh[4] | qs[16]               x = d * (q5 - 16)
    Q5_1   24: d, m half | qh[4] | qs[16]            x = d * q5 + m
    Q8_0   34: d half | i8 qs[32]                    x = q * d
    Q2_K   84: scales[16] | qs[64] | d, dmin half    x = (d * sc) * q2 - (dmin * mn)
    Q3_K  110: hmask[32] | qs[64] | scales[12] | d   x = (d * (sc - 32)) * (q2 - 4 * !h)
    Q4_K  144: d, dmin | scales[12] | qs[128]        x = (d * sc) * q4 - (dmin * mn)
    Q5_K  176: d, dmin | scales[12] | qh[32] | qs[128]
    Q6_K  210: ql[128] | qh[64] | i8 scales[16] | d  x = (d * sc) * (q6 - 32)
    MXFP4  17: e (E8M0) | qs[16] (E2M1 codes)        x = 2^(e-128) * 2 * e2m1(q)

Where a byte holds two 4-bit codes, a run of low nibbles comes first, then the high nibbles.
Dimension letters: N blocks, and the element index within a block.

Must not choose slots or move bytes between tiers: blocks in, values out.
"""
from __future__ import annotations

from typing import Callable

import torch

from strata.quant import GGMLType, block_size, ggml_type

_Consts = dict[tuple[str, str], torch.Tensor]
_CONSTS: _Consts = {}  # small index and shift tensors, made once per device


def _const(name: str, device: torch.device, values: list[int], shape: tuple[int, ...],
           dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    key = (name, str(device))
    t = _CONSTS.get(key)
    if t is None:
        t = torch.tensor(values, dtype=dtype).reshape(shape).to(device)
        if t.is_cuda:  # made on whichever stream is current; it may be read on any other one
            torch.cuda.synchronize(t.device)
        _CONSTS[key] = t
    return t


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
    lut = _const("e2m1x2", b.device, [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], (16,), torch.float32)
    q = _nibbles(b[:, 1:17], 16).long()
    return d * lut[q]


_BLOCK_KERNELS: dict[GGMLType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.Q4_0: _q4_0, GGMLType.Q4_1: _q4_1, GGMLType.Q5_0: _q5_0, GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0, GGMLType.Q2_K: _q2_k, GGMLType.Q3_K: _q3_k, GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k, GGMLType.Q6_K: _q6_k, GGMLType.MXFP4: _mxfp4,
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


__all__ = ["TORCH_DEQUANT_TYPES", "dequantize_into"]
