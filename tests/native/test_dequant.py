"""Native dequantization against gguf-py, bit for bit, for every format and both kernel families.

Reference truths: `gguf.quants.dequantize` (float32 values) and torch's `.to(float16/bfloat16)`
(rounding of those values). Comparisons are on uint32/uint16 views, so NaN payloads and signed
zeros count. Blocks are random bytes with the scale fields then overwritten by special values.
"""
from __future__ import annotations

import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
import torch

from strata import native
from strata.quant import DEQUANT_TYPES, GGMLType, block_size

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]

# "avx512" has no dequantization kernels of its own: it runs the AVX2 ones, and must match too.
IMPLS = ["scalar", pytest.param("avx2", marks=pytest.mark.skipif(
    not native.cpu_has_avx2(), reason="CPU has no AVX2/FMA/F16C")),
    pytest.param("avx512", marks=pytest.mark.skipif(
        not native.cpu_has_avx512(), reason="CPU has no AVX-512 F/BW/VL/VNNI"))]

# float16 scale values: zero, -0, max finite (65504), smallest and largest subnormal, smallest
# normal, +-1, inf, quiet/signalling/negative NaNs with payloads.
SPECIAL_F16 = np.array([0x0000, 0x8000, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00,
                        0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFD23], dtype="<u2")
SPECIAL_BF16 = np.array([0x0000, 0x8000, 0x7F7F, 0xFF7F, 0x0001, 0x8001, 0x0080, 0x3F80, 0x7F80,
                         0xFF80, 0x7FC0, 0x7F81, 0xFFC1], dtype="<u2")
SPECIAL_F32 = np.array([0x00000000, 0x80000000, 0x7F7FFFFF, 0x00000001, 0x80800000, 0x7F800000,
                        0xFF800000, 0x7FC00000, 0x7F800001, 0xFFA12345], dtype="<u4")
INT8_EXTREMES = np.array([-128, 127, 0, -1], dtype=np.int8)
E8M0_ALL = np.arange(256, dtype=np.uint8)

# Per format: (byte offsets of a scale field in one block, special values for it, share of blocks
# that get one). F32/F16/BF16 are one element per "block": their specials are element values.
SCALE_FIELDS: dict[GGMLType, list[tuple[tuple[int, ...], np.ndarray, float]]] = {
    T.F32: [((0,), SPECIAL_F32, 0.1)],
    T.F16: [((0,), SPECIAL_F16, 0.1)],
    T.BF16: [((0,), SPECIAL_BF16, 0.1)],
    T.Q4_0: [((0,), SPECIAL_F16, 0.5)],                         # d
    T.Q4_1: [((0, 2), SPECIAL_F16, 0.5)],                       # d, m
    T.Q5_0: [((0,), SPECIAL_F16, 0.5)],                         # d
    T.Q5_1: [((0, 2), SPECIAL_F16, 0.5)],                       # d, m
    T.Q8_0: [((0,), SPECIAL_F16, 0.5)],                         # d
    T.Q2_K: [((80, 82), SPECIAL_F16, 0.5)],                     # d, dmin
    T.Q3_K: [((108,), SPECIAL_F16, 0.5)],                       # d
    T.Q4_K: [((0, 2), SPECIAL_F16, 0.5)],                       # d, dmin
    T.Q5_K: [((0, 2), SPECIAL_F16, 0.5)],                       # d, dmin
    T.Q6_K: [((208,), SPECIAL_F16, 0.5),                        # d
             (tuple(range(192, 208)), INT8_EXTREMES, 0.25)],    # int8 sub-block scales
    T.MXFP4: [((0,), E8M0_ALL, 1.0)],                           # e: every exponent, cycled
    T.IQ2_XXS: [((0,), SPECIAL_F16, 0.5)],                      # d (i-quants: one half d each)
    T.IQ2_XS: [((0,), SPECIAL_F16, 0.5)],
    T.IQ2_S: [((0,), SPECIAL_F16, 0.5)],
    T.IQ3_XXS: [((0,), SPECIAL_F16, 0.5)],
    T.IQ3_S: [((0,), SPECIAL_F16, 0.5)],
    T.IQ1_S: [((0,), SPECIAL_F16, 0.5)],
    T.IQ1_M: [],                                                # d split over nibbles: test_dequant_iquants.py
    T.IQ4_NL: [((0,), SPECIAL_F16, 0.5)],
    T.IQ4_XS: [((0,), SPECIAL_F16, 0.5)],
    T.TQ1_0: [((52,), SPECIAL_F16, 0.5)],
    T.TQ2_0: [((64,), SPECIAL_F16, 0.5)],
    T.NVFP4: [((0, 1, 2, 3), E8M0_ALL, 1.0)],                   # UE4M3 scales: every byte, cycled
}

# (rows, row length, threads): one row, many rows, rows that do not split evenly among threads.
# Row lengths are multiples of 256, so every format (K types included) has >= 2 blocks per call:
# with a single block, numpy picks m's NaN over d*q's in Q4_1/Q5_1's `d*q + m`, with more it
# picks d*q's, as the native kernels always do.
CASES = [(1, 512, 1), (37, 512, 2), (7, 512, 3), (2, 768, 5)]
CASE_IDS = [f"{r}x{n}-t{t}" for r, n, t in CASES]


def random_blocks(t: GGMLType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """[n_blocks, block bytes] uint8: random bytes, scale fields overwritten with specials."""
    _, nbytes = block_size(t)
    blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for offsets, values, share in SCALE_FIELDS[t]:
        width = values.dtype.itemsize
        for off in offsets:
            picked = np.flatnonzero(rng.random(n_blocks) < share)
            chosen = np.resize(rng.permutation(values), len(picked))  # cycles through all values
            blocks[picked, off:off + width] = chosen.view(np.uint8).reshape(-1, width)
    return blocks


@lru_cache(maxsize=None)
def fixture(t: GGMLType, rows: int, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed source [rows, row bytes] uint8, gguf-py's float32 result [rows, row_len])."""
    elems, _ = block_size(t)
    rng = np.random.default_rng([int(t), rows, row_len])
    src = random_blocks(t, rows * row_len // elems, rng).reshape(rows, -1)
    with np.errstate(all="ignore"):  # inf * 0 and NaN scales are part of the test
        ref = gguf.quants.dequantize(src, t)
    assert ref.dtype == np.float32 and ref.shape == (rows, row_len)
    return src, np.ascontiguousarray(ref)


def assert_bits_equal(found: np.ndarray, expected: np.ndarray, what: str) -> None:
    uint = {4: np.uint32, 2: np.uint16}[expected.dtype.itemsize]
    f, e = found.view(uint), expected.view(uint)
    bad = np.argwhere(f != e)
    assert bad.size == 0, (f"{what}: {len(bad)} of {e.size} values differ; first at {tuple(bad[0])}: "
                           f"found {f[tuple(bad[0])]:#x}, expected {e[tuple(bad[0])]:#x}")


# ---- float32 output against gguf-py ----

def test_dequant_types_cover_gguf_formats():
    assert set(DEQUANT_TYPES) == set(SCALE_FIELDS)


@pytest.mark.parametrize("t", [t for t in DEQUANT_TYPES if t not in (T.F32, T.F16, T.BF16, T.MXFP4, T.NVFP4, T.IQ1_M)],
                         ids=lambda t: t.name)
def test_scale_offsets_are_the_scale_fields(t):
    """Zeroing the float16 fields SCALE_FIELDS lists zeroes the block in gguf-py: the offset table
    really points at the scales."""
    blocks = np.random.default_rng(1).integers(0, 256, size=(4, block_size(t)[1]), dtype=np.uint8)
    offsets, _, _ = SCALE_FIELDS[t][0]
    for off in offsets:
        blocks[:, off:off + 2] = 0
    assert np.all(gguf.quants.dequantize(blocks.reshape(1, -1), t) == 0)


@pytest.mark.parametrize("t", DEQUANT_TYPES, ids=lambda t: t.name)
def test_fixtures_hold_every_special_value(t):
    """The many-rows fixture has each special scale (and every MXFP4 exponent) at each field."""
    src, _ = fixture(t, 37, 512)
    blocks = src.reshape(-1, block_size(t)[1])
    for offsets, values, _ in SCALE_FIELDS[t]:
        width = values.dtype.itemsize
        for off in offsets:
            found = np.ascontiguousarray(blocks[:, off:off + width]).view(values.dtype).ravel()
            missing = set(values.tolist()) - set(found.tolist())
            assert not missing, f"{t.name}: offset {off} never holds {sorted(missing)}"


def each_format_impl_case(test):
    """`test(t, impl, case)` over every format, implementation and (rows, row length, threads)."""
    test = pytest.mark.parametrize("t", DEQUANT_TYPES, ids=lambda t: t.name)(test)
    test = pytest.mark.parametrize("impl", IMPLS)(test)
    return pytest.mark.parametrize("case", CASES, ids=CASE_IDS)(test)


@each_format_impl_case
def test_dequant_f32_matches_gguf(t, impl, case):
    rows, row_len, n_threads = case
    src, ref = fixture(t, rows, row_len)
    out = native.dequantize(t, src, (rows, row_len), n_threads=n_threads, impl=impl)
    assert_bits_equal(out, ref, f"{t.name} {impl} {rows}x{row_len} on {n_threads} threads")


@each_format_impl_case
def test_dequant_half_outputs_match_torch(t, impl, case):
    """float16/bfloat16 output equals gguf-py's float32 result rounded by torch."""
    rows, row_len, n_threads = case
    src, ref = fixture(t, rows, row_len)
    ref_t = torch.from_numpy(ref)
    for dtype in (torch.float16, torch.bfloat16):
        out = torch.empty((rows, row_len), dtype=dtype)
        native.dequantize_into(t, src, out, n_threads=n_threads, impl=impl)
        assert_bits_equal(out.view(torch.int16).numpy(), ref_t.to(dtype).view(torch.int16).numpy(),
                          f"{t.name} {impl} -> {dtype}")
    out = native.dequantize(t, src, (rows, row_len), dtype=np.float16, n_threads=n_threads, impl=impl)
    assert_bits_equal(out.view(np.int16), ref_t.to(torch.float16).view(torch.int16).numpy(),
                      f"{t.name} {impl} -> numpy float16")


@pytest.mark.parametrize("impl", IMPLS)
def test_dequant_from_torch_source_and_3d_output(impl):
    src, ref = fixture(T.Q4_K, 37, 512)
    out = torch.empty((37, 1, 512), dtype=torch.float32)
    native.dequantize_into(T.Q4_K, torch.from_numpy(src), out, n_threads=2, impl=impl)
    assert_bits_equal(out.numpy().reshape(37, 512), ref, "Q4_K from a torch source")


# ---- float32 -> float16 / bfloat16 conversion against torch ----

def f32(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32)


# Ties go to the even neighbour; one ulp above a tie goes up.
F16_EDGES = np.concatenate([
    f32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA12345, 0x7FFFFFFF, 0x7F802000]),  # NaNs
    np.array([np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0], dtype=np.float32),
    np.array([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2048 + 1, 2048 + 3], dtype=np.float32),  # ties
    np.array([65504, 65519, 65520, 65536, 1e6, -65520, 3.4028235e38], dtype=np.float32),          # overflow
    np.array([2**-24, 2**-25, 3 * 2**-25, 5 * 2**-25, 2**-26, 2**-14, 2**-14 - 2**-25,
              2**-14 - 2**-26, -(2**-25), 1.5 * 2**-25], dtype=np.float32),                        # subnormals
    f32([0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x33000000, 0x33000001, 0x387FE000,
         0x387FF000, 0x387FF001]),
    np.nextafter(np.float32(1 + 2**-11), np.float32(2)).reshape(1),
])
BF16_EDGES = np.concatenate([
    F16_EDGES,
    np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-8 + 2**-20], dtype=np.float32),
    f32([0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF, 0xFF7FFFFF, 0x00008000, 0x00018000,
         0x00007FFF, 0x80008001]),
])


def convert_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2**32, size=100_003, dtype=np.uint64).astype(np.uint32).view(np.float32)
    near_half_range = (rng.standard_normal(50_001) * 2.0 ** rng.integers(-30, 20, 50_001)).astype(np.float32)
    return [BF16_EDGES, random_bits, near_half_range, BF16_EDGES[:5]]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_convert_matches_torch(impl, dtype):
    for src in convert_cases():
        expected = torch.from_numpy(src).to(dtype).view(torch.int16).numpy()
        out = torch.empty(src.shape, dtype=dtype)
        native.convert_f32_into(src, out, impl=impl)
        assert_bits_equal(out.view(torch.int16).numpy(), expected, f"convert {len(src)} to {dtype} ({impl})")
        if dtype == torch.float16:
            out_np = np.empty(src.shape, dtype=np.float16)
            native.convert_f32_into(src, out_np, impl=impl)
            assert_bits_equal(out_np.view(np.int16), expected, f"convert {len(src)} to numpy float16 ({impl})")


def test_convert_edge_values_are_what_torch_gives():
    """Pins the behaviour the kernels reproduce, so a torch upgrade that changes it is noticed."""
    nans = f32([0x7F800001, 0xFFA12345])
    assert torch.from_numpy(nans).to(torch.float16).view(torch.int16).numpy().view(np.uint16).tolist() == [0x7E00, 0xFF09]
    assert torch.from_numpy(nans).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).tolist() == [0xFFFF, 0xFFFF]
    ties = np.array([65520, 1 + 2**-11, 3 * 2**-25], dtype=np.float32)
    assert torch.from_numpy(ties).to(torch.float16).view(torch.int16).numpy().view(np.uint16).tolist() == [0x7C00, 0x3C00, 0x0002]


# ---- Input checks of the Python wrapper ----

def q4_0_src(rows: int = 2, row_len: int = 64) -> np.ndarray:
    return fixture(T.Q4_0, 1, 512)[0].ravel()[: rows * row_len // 32 * 18]


@pytest.mark.parametrize("out, message", [
    (np.empty((2, 64), np.float64), "dtype must be float32 or float16, found float64"),
    (torch.empty((2, 64), dtype=torch.int32), "dtype must be float32, float16 or bfloat16, found torch.int32"),
    (np.empty((2, 128), np.float32)[:, ::2], "C-contiguous"),
    (torch.empty((64, 2)).t(), "must be contiguous"),
], ids=["numpy-dtype", "torch-dtype", "numpy-strided", "torch-transposed"])
def test_rejects_bad_output(out, message):
    with pytest.raises(ValueError, match=message):
        native.dequantize_into(T.Q4_0, q4_0_src(), out)


def test_rejects_read_only_output():
    out = np.empty((2, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        native.dequantize_into(T.Q4_0, q4_0_src(), out)


def test_rejects_output_of_unknown_kind():
    with pytest.raises(TypeError, match="numpy array or a torch tensor, found list"):
        native.dequantize_into(T.Q4_0, q4_0_src(), [0.0] * 128)


def test_rejects_short_source():
    with pytest.raises(ValueError, match="needs 72 packed bytes, source holds 71"):
        native.dequantize(T.Q4_0, q4_0_src()[:71], (2, 64))


def test_rejects_row_not_a_block_multiple():
    with pytest.raises(ValueError, match="row length 48 .* not a multiple of the block size 32"):
        native.dequantize(T.Q4_0, q4_0_src(), (2, 48))
    with pytest.raises(ValueError, match="row length 384 .* not a multiple of the block size 256"):
        native.dequantize(T.Q4_K, fixture(T.Q4_K, 37, 512)[0], (2, 384))


@pytest.mark.parametrize("n_threads", [0, -1, 1.5])
def test_rejects_bad_thread_count(n_threads):
    with pytest.raises(ValueError, match="n_threads must be a positive integer"):
        native.dequantize(T.Q4_0, q4_0_src(), (2, 64), n_threads=n_threads)


@pytest.mark.parametrize("t, message", [
    ("q9_9", "unknown ggml type name 'q9_9'"),
    (1234, "unknown ggml type id 1234"),
    (T.Q8_1, "dequantization of Q8_1 is not supported"),
])
def test_rejects_unknown_type(t, message):
    with pytest.raises(ValueError, match=message):
        native.dequantize(t, q4_0_src(), (2, 64))


def test_rejects_unknown_impl():
    with pytest.raises(ValueError, match="unknown implementation 'neon'"):
        native.dequantize(T.Q4_0, q4_0_src(), (2, 64), impl="neon")
    with pytest.raises(ValueError, match="unknown implementation 'neon'"):
        native.convert_f32_into(np.zeros(4, np.float32), np.empty(4, np.float16), impl="neon")


def test_convert_rejects_mismatched_sizes():
    with pytest.raises(ValueError, match="has 3 elements, source has 4"):
        native.convert_f32_into(np.zeros(4, np.float32), np.empty(3, np.float16))
    with pytest.raises(ValueError, match="C-contiguous float32"):
        native.convert_f32_into(np.zeros(4, np.float64), np.empty(4, np.float16))


# ---- Implementation choice ----

def default_impl_in_subprocess(kernel: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "STRATA_KERNEL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if kernel is not None:
        env["STRATA_KERNEL"] = kernel
    code = "from strata import native; print(native.default_impl())"
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_kernel_env_var_caps_auto():
    expected = "avx512" if native.cpu_has_avx512() else "avx2" if native.cpu_has_avx2() else "scalar"
    assert default_impl_in_subprocess("scalar") == "scalar"
    assert default_impl_in_subprocess("avx512") == expected
    assert default_impl_in_subprocess(None) == expected


def test_formats_without_avx2_kernel_report_scalar_fallback():
    assert all(native.has_kernel(t, "scalar") for t in DEQUANT_TYPES)
    assert not native.has_kernel(T.Q4_1, "avx2")
    assert native.has_kernel(T.Q4_K, "avx2")


@pytest.mark.parametrize("name", ["F32", "Q8_0", "Q4_K", "IQ4_XS"])
def test_dequantize_rows_is_the_whole_matrix_rows(name):
    """An embedding lookup (rows by index, repeated and out of order) equals the same rows of the
    whole matrix dequantized; a row past the matrix or an output of the wrong shape is refused."""
    from strata.quant import random_blocks
    t, rows, k = GGMLType[name], 9, 512
    data = random_blocks(t, rows * k // block_size(t)[0], np.random.default_rng(3)).view(np.uint8).reshape(-1)
    whole = native.dequantize(t, data, (rows, k))
    ids = [4, 0, 8, 4]
    out = torch.empty(len(ids), k)
    native.dequantize_rows(t, torch.from_numpy(data.copy()), ids, out)
    assert np.array_equal(out.numpy(), whole[ids], equal_nan=True)
    with pytest.raises(IndexError, match="row 9 of a 9-row"):
        native.dequantize_rows(t, data, [9], torch.empty(1, k))
    with pytest.raises(ValueError, match="float32"):
        native.dequantize_rows(t, data, [1, 2], torch.empty(1, k))
