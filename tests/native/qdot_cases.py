"""Shared data and bounds of the quantized matrix kernel tests (test_qdot*.py): weights, tokens, the
numpy activation quantizer, and the bounds a tile is held to.

With A = d * q the rounded activations (A = x for F32/F16/BF16 weights), W = gguf.quants'
dequantization, u = 2^-24 and n = blocks per row + 16 (row length + 16 for float weights):
  |y - W @ A| <= n * u * (|W|' @ |A|) + n * 2^-140                   (float rounding only)
  |y - W @ x| <= sum_i |W_i| * d_i / 2 * (1 + 2^-15) + the bound above (activation rounding)
where |W|' = |W| for symmetric formats and |W - W0| + |W0| for formats with a min (W0: the block with
its codes zeroed, i.e. the min), since their integer and min parts are rounded apart; (1 + 2^-15)
covers the rounding of x / d before it is rounded to an integer. Two tiles of one type are both
within that bound of the exact W @ A, so each is held within twice it of the scalar twin (only the
order of the float additions differs; the integer block sums are exact in every tile).
"""
from __future__ import annotations

import gguf.quants
import numpy as np

from strata import native
from strata.quant import HALF_SCALE_OFFSETS, GGMLType, block_size, random_blocks, set_iq1_m_half
from strata.quant_table import BY_NAME, TYPES

T = GGMLType
U = 2.0 ** -24
ALL = tuple(T[row.name] for row in TYPES)
FLOAT_TYPES = tuple(T[row.name] for row in TYPES if row.group == "float")
# Element magnitudes ~0.03 from random codes: the d each i-quant needs (its grids and scales differ).
SCALES = {T[row.name]: row.scale for row in TYPES if row.group == "iq"}
# Byte ranges of the codes of formats with a min (zeroing them leaves the min alone).
CODE_BYTES = {T[row.name]: row.min_codes for row in TYPES if row.min_codes}
# Zero, -0, smallest and largest subnormal, smallest normal, tiny, 65504, -65504.
EXTREME_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x0C00, 0x7BFF, 0xFBFF], dtype="<u2")
EXTREME_E8M0 = np.array([0, 1, 2, 100, 140], dtype=np.uint8)
EXTREME_UE4M3 = np.array([0x00, 0x01, 0x08, 0x7E, 0x7F, 0xFF], dtype=np.uint8)

# (rows, blocks per row, tokens): rows not a multiple of the kernels' row groups (4, 2), one block
# and many (9, 17: windows of 8 blocks of the prefill over unpacked rows), T in {1, 2, 3, 4, 5, 7, 9, 13,
# 64}. Float formats use the "blocks" as a row length (1, 3: tail path).
CASES = [(5, 1, 1), (13, 3, 1), (7, 1, 2), (3, 2, 3), (6, 3, 7), (9, 2, 13), (33, 2, 64), (4, 5, 4), (6, 9, 5),
         (7, 17, 9)]
CASE_IDS = [f"N{n}-B{b}-T{t}" for n, b, t in CASES]


def row_of(t: GGMLType):
    return BY_NAME[t.name]


def group(t: GGMLType) -> str:
    return row_of(t).group


def row_len_of(t: GGMLType, n_blocks: int) -> int:
    return {1: 1, 3: 37, 2: 64, 5: 263}.get(n_blocks, n_blocks) if t in FLOAT_TYPES else n_blocks * block_size(t)[0]


def make_weights(t: GGMLType, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row bytes] uint8: quantized by gguf where it can (float formats, the 32-value formats),
    random codes otherwise (the K-quants: uniform halves; the i-quants, ternary formats and NVFP4:
    random_blocks at the row's scale); ~30% of blocks get an extreme scale."""
    elems, nbytes = block_size(t)
    n_blocks = n_rows * row_len // elems
    if t in FLOAT_TYPES:
        w = rng.standard_normal((n_rows, row_len)).astype(np.float32) * np.float32(10.0) ** rng.uniform(-3, 3, (n_rows, 1)).astype(np.float32)
        special = {T.F32: [0.0, 1e-40, 3e30], T.F16: [0.0, 6e-8, 65504.0], T.BF16: [0.0, 1e-30, 1e30]}[t]
        flat = w.reshape(-1)
        flat[rng.integers(0, flat.size, size=max(1, flat.size // 10))] = rng.choice(special, size=max(1, flat.size // 10))
        return gguf.quants.quantize(w, t).view(np.uint8).reshape(n_rows, -1)
    if group(t) == "iq":
        return extreme_scales(t, random_blocks(t, n_blocks, rng, row_of(t).scale).reshape(n_blocks, nbytes), rng
                              ).reshape(n_rows, -1)
    if group(t) == "q":
        x = rng.standard_normal((n_blocks, elems)).astype(np.float32) * np.float32(10.0) ** rng.uniform(-4, 2, (n_blocks, 1)).astype(np.float32)
        blocks = gguf.quants.quantize(x, t).view(np.uint8).reshape(n_blocks, nbytes).copy()
    else:
        blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
        for off in HALF_SCALE_OFFSETS[t]:
            halves = rng.uniform(2.0 ** -10, 1.0, n_blocks).astype(np.float16)
            blocks[:, off:off + 2] = halves.view(np.uint8).reshape(n_blocks, 2)
    picked = rng.random(n_blocks) < 0.3
    if t == T.MXFP4:
        blocks[picked, 0] = rng.choice(EXTREME_E8M0, size=int(picked.sum()))
    else:
        for off in HALF_SCALE_OFFSETS[t]:
            chosen = rng.choice(EXTREME_HALVES, size=int(picked.sum()))
            blocks[picked, off:off + 2] = chosen.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(n_rows, -1)


def extreme_scales(t: GGMLType, blocks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """~30% of `blocks` [N, bytes] with an extreme scale (zero, subnormal, 65504; NVFP4: the smallest,
    largest and zero UE4M3 codes), in place."""
    picked = np.flatnonzero(rng.random(len(blocks)) < 0.3)
    if t == T.NVFP4:
        blocks[picked, rng.integers(0, 4, len(picked))] = rng.choice(EXTREME_UE4M3, len(picked))
    elif t == T.IQ1_M:
        sub = blocks[picked]
        set_iq1_m_half(sub, rng.choice(EXTREME_HALVES, len(picked)))
        blocks[picked] = sub
    else:
        for off in HALF_SCALE_OFFSETS.get(t, ()):
            blocks[picked, off:off + 2] = rng.choice(EXTREME_HALVES, len(picked)).view(np.uint8).reshape(-1, 2)
    return blocks


def random_weights(t: GGMLType, n_rows: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[n_rows, row bytes] of valid random blocks, ~30% with an extreme scale: the i-quants' maker, and
    for the K-quants random_blocks at d ~ 0.001 (the zmm and VNNI tiles' tests)."""
    n_blocks = n_rows * row_len // block_size(t)[0]
    if group(t) == "iq":
        return make_weights(t, n_rows, row_len, rng)
    blocks = random_blocks(t, n_blocks, rng, 0.001 if group(t) == "k" else row_of(t).scale).reshape(n_blocks, -1)
    return (extreme_scales(t, blocks.copy(), rng) if group(t) == "k" else blocks).reshape(n_rows, -1)


def make_tokens(n_tokens: int, row_len: int, rng: np.random.Generator) -> np.ndarray:
    """[T, K] float32 of mixed magnitudes; with T > 1 one row is zero, one has a zero stretch, and
    with T >= 4 one row is tiny (1e-30, still normal after / 127)."""
    x = rng.standard_normal((n_tokens, row_len)).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-2, 2, (n_tokens, 1)).astype(np.float32)
    if n_tokens > 1:
        x[1] = 0.0
        x[0, : min(row_len, 40)] = 0.0
    if n_tokens >= 4:
        x[3] *= np.float32(1e-30)
    return x


def dequantize(t: GGMLType, w: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    return gguf.quants.dequantize(w, t).reshape(n_rows, row_len).astype(np.float64)


def magnitude(t: GGMLType, w: np.ndarray, n_rows: int, row_len: int) -> np.ndarray:
    """|W|', see the module docstring."""
    wd = dequantize(t, w, n_rows, row_len)
    if t not in CODE_BYTES:
        return np.abs(wd)
    lo, hi = CODE_BYTES[t]
    blocks = w.reshape(-1, block_size(t)[1]).copy()
    blocks[:, lo:hi] = 0
    w0 = dequantize(t, blocks, n_rows, row_len)
    return np.abs(wd - w0) + np.abs(w0)


# ---- numpy re-implementation of the activation quantizers ----

ACT_Q8 = np.dtype([("d", "<f4"), ("s", "<f4"), ("q", "i1", 32)])
ACT_Q8K = np.dtype([("d", "<f4"), ("q", "i1", 256), ("bsums", "<i2", 16)])


def act_block(t: GGMLType) -> int:
    return {"F32": 1, "Q8": 32, "Q8K": 256}[row_of(t).act]


def numpy_qact(t: GGMLType, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(activation bytes [T, row bytes], d per block [T, K / blk], A = d * q as float64 [T, K])."""
    n_tok, k = x.shape
    if t in FLOAT_TYPES:
        return x.view(np.uint8).reshape(n_tok, -1), np.zeros((n_tok, k)), x.astype(np.float64)
    blk = act_block(t)
    xb = x.reshape(n_tok, k // blk, blk)
    d = (np.abs(xb).max(axis=-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = xb / d[..., None]
    q = np.where(d[..., None] == 0, 0, np.clip(np.rint(v), -127, 127)).astype(np.int8)
    out = np.zeros((n_tok, k // blk), dtype=ACT_Q8 if blk == 32 else ACT_Q8K)
    out["d"], out["q"] = d, q
    if blk == 32:
        out["s"] = (d * q.astype(np.int32).sum(-1).astype(np.float32)).astype(np.float32)
    else:
        out["bsums"] = q.reshape(n_tok, k // blk, 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    a = (d[..., None].astype(np.float64) * q).reshape(n_tok, k)
    return out.view(np.uint8).reshape(n_tok, -1), d, a


# ---- bounds ----

def rounding_bound(t: GGMLType, a: np.ndarray, mag: np.ndarray) -> np.ndarray:
    """[T, N]: the float-rounding bound of |y - W @ A| (module docstring), A [T, K], |W|' [N, K]."""
    row_len = a.shape[1]
    n = (row_len if t in FLOAT_TYPES else row_len // block_size(t)[0]) + 16
    return n * U * (np.abs(a) @ mag.T) + n * 2.0 ** -140


def assert_within_bounds(t: GGMLType, impl: str, y: np.ndarray, x: np.ndarray, wd: np.ndarray,
                         mag: np.ndarray) -> None:
    """y [T, N] from x [T, K] and weights dequantized to wd [N, K] (element magnitudes `mag`, the
    bound's scale): |y - W @ A| within float rounding, with A the rounded activations, and
    |y - W @ x| within that plus the activation rounding (half a step of each block's d)."""
    row_len = x.shape[1]
    _, d, a = numpy_qact(t, x)
    round_tol = rounding_bound(t, a, mag)
    err = np.abs(y - a @ wd.T)
    assert (err <= round_tol).all(), f"{t.name} {impl}: |y - W@A| {err.max()} over the rounding bound"
    d_elem = np.repeat(d, row_len // d.shape[1], axis=1) if t not in FLOAT_TYPES else np.zeros_like(x, np.float64)
    act_tol = (d_elem * 0.5 * (1 + 2.0 ** -15)) @ np.abs(wd).T
    err = np.abs(y - x.astype(np.float64) @ wd.T)
    assert (err <= act_tol + round_tol).all(), f"{t.name} {impl}: |y - W@x| {err.max()} over the bound"


def qdot(t: GGMLType, w: np.ndarray, x: np.ndarray, tile: str) -> np.ndarray:
    """The product by one tile kind ('ref' is the scalar twin)."""
    return native.qdot_rows(t, w, w.shape[0], x.shape[1], x, tile=tile)


def assert_close_to_scalar(t: GGMLType, w: np.ndarray, x: np.ndarray, tile: str, what: str = "",
                           mag: np.ndarray | None = None) -> np.ndarray:
    """The product by `tile` within twice the rounding bound of the scalar twin's (|W| unless `mag`
    is given); finiteness alike. Returns the tile's product."""
    n_rows, row_len = w.shape[0], x.shape[1]
    ys = qdot(t, w, x, "ref").astype(np.float64)
    y = qdot(t, w, x, tile)
    if mag is None:
        mag = np.abs(native.dequantize(t, w.reshape(-1), (n_rows, row_len)).astype(np.float64))
    tol = 2 * rounding_bound(t, numpy_qact(t, x)[2], mag)
    err = np.abs(y.astype(np.float64) - ys)
    assert np.isfinite(y).all() == np.isfinite(ys).all(), f"{t.name} {tile} {what}: finiteness differs"
    assert (err <= tol).all(), f"{t.name} {tile} {what}: differs from scalar by {err.max()} (bound {tol.max()})"
    return y


def bits(y) -> bytes:
    return np.asarray(y, dtype=np.float32).view(np.uint32).tobytes()
