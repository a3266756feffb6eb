"""The i-quants, ternary formats and NVFP4 beyond what test_dequant.py's table covers (it checks
every format's half-precision scale fields with special values, bit for bit against gguf-py):
IQ1_M's half d spread over four nibbles, valid blocks of every type at real magnitudes, the
generated grid header against gguf-py, and refusals.
"""
from __future__ import annotations

import subprocess
import sys

import gguf.quants
import numpy as np
import pytest
import torch

from strata import native
from strata.quant import DEQUANT_TYPES, IQ_TYPES, GGMLType, block_size, random_blocks, set_iq1_m_half
from tests.native.test_dequant import CASE_IDS, CASES, IMPLS, ROOT, SPECIAL_F16, assert_bits_equal

T = GGMLType
#: The grid i-quants, whose AVX-512 decode tiles are planes or gathers (kinds "planes", "vbmi" of the table).
GRID_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)
#: The grid i-quants decode with tiles of the AVX-512 family here.
GRID_DECODE_512 = native.cpu_has_avx512() and native.qdot.select(T.IQ2_XXS, "avx512", 1) in ("planes", "vbmi")


def test_generated_tables_are_gguf_pys():
    """native/formats/iq_tables.h is what native/formats/gen_iq_tables.py makes from the installed gguf-py."""
    out = subprocess.run([sys.executable, str(ROOT / "native" / "formats" / "gen_iq_tables.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def iq1_m_blocks(n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """IQ1_M blocks [N, 56]: random bytes, half the blocks' d a special float16 value."""
    blocks = rng.integers(0, 256, size=(n_blocks, block_size(T.IQ1_M)[1]), dtype=np.uint8)
    halves = (rng.random(n_blocks) * 0.01 + 1e-3).astype(np.float16).view(np.uint16)
    picked = np.flatnonzero(rng.random(n_blocks) < 0.5)
    halves[picked] = np.resize(rng.permutation(SPECIAL_F16), len(picked))
    set_iq1_m_half(blocks, halves)
    return blocks


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("impl", IMPLS)
def test_iq1_m_special_scales_match_gguf(impl, case):
    rows, row_len, n_threads = case
    src = iq1_m_blocks(rows * row_len // 256, np.random.default_rng(rows)).reshape(rows, -1)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(src, T.IQ1_M)
    assert np.isnan(ref).any() or rows < 7  # the NaN and inf scales are there
    assert_bits_equal(native.dequantize(T.IQ1_M, src, (rows, row_len), n_threads=n_threads, impl=impl), ref,
                      f"IQ1_M {impl} {rows}x{row_len}")
    for dtype in (torch.float16, torch.bfloat16):
        out = torch.empty((rows, row_len), dtype=dtype)
        native.dequantize_into(T.IQ1_M, src, out, n_threads=n_threads, impl=impl)
        want = torch.from_numpy(ref).to(dtype).view(torch.int16).numpy()
        assert_bits_equal(out.view(torch.int16).numpy(), want, f"IQ1_M {impl} -> {dtype}")


def test_set_iq1_m_half_is_gguf_pys_d():
    """The helper writes d where gguf-py reads it, leaving the 3-bit scales alone."""
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, size=(4, 56), dtype=np.uint8)
    before = blocks.copy()
    set_iq1_m_half(blocks, np.zeros(4, np.float16))
    assert np.all(gguf.quants.dequantize(blocks.reshape(1, -1), T.IQ1_M) == 0)
    words, old = blocks[:, 48:].copy().view("<u2"), before[:, 48:].copy().view("<u2")
    assert np.array_equal(words & 0x0FFF, old & 0x0FFF) and np.array_equal(blocks[:, :48], before[:, :48])


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_valid_blocks_match_gguf_in_every_dtype(t, n_threads):
    """Blocks as a model holds them (finite scales, random codes), 13 rows of 768 values."""
    rows, row_len = 13, 768
    src = random_blocks(t, rows * row_len // block_size(t)[0], np.random.default_rng(int(t))).reshape(rows, -1)
    ref = gguf.quants.dequantize(src, t)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    assert_bits_equal(native.dequantize(t, src, (rows, row_len), n_threads=n_threads), ref, t.name)
    for dtype in (torch.float16, torch.bfloat16):
        out = torch.empty((rows, row_len), dtype=dtype)
        native.dequantize_into(t, torch.from_numpy(src.reshape(-1)), out, n_threads=n_threads)
        assert torch.equal(out, torch.from_numpy(ref).to(dtype)), f"{t.name} -> {dtype}"


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_bad_lengths_are_refused(t):
    elems, nbytes = block_size(t)
    src = random_blocks(t, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=f"{t.name}: row length {elems + 16} .* not a multiple of the block size {elems}"):
        native.dequantize(t, src, (1, elems + 16))
    with pytest.raises(ValueError, match=f"{t.name}: output .* needs {4 * nbytes} packed bytes, source holds {4 * nbytes - 1}"):
        native.dequantize(t, src[:-1], (2, 2 * elems))
def test_type_support_reports_the_native_tables():
    for t in DEQUANT_TYPES:
        s = native.type_support(t)
        assert s.dequant and s.packed and s.families[0] == "scalar" and s.runs is not None, s
    for t in IQ_TYPES:
        s = native.type_support(t.name.lower())
        if t == T.IQ4_NL:  # AVX-512 tiles of its own too (test_qdot_avx512.py)
            assert s.families == ("scalar", "avx2", "avx512") and s.runs == native.default_impl(), s
            assert s.verdict() == f"{t.name}: dequantize yes; packed compute yes (scalar/avx2/avx512 kernels)"
            continue
        if t == T.TQ1_0 and "avx512" in s.families:  # AVX-512 decode of its own, prefill the AVX2 build
            assert s.families == ("scalar", "avx2", "avx512"), s   # (test_qdot_tq1_avx512.py)
            own = "avx2" if native.cpu_splits_512() else "avx512"  # Zen 4 decodes with the AVX2 build (qdot.c)
            assert (s.runs, s.decode_runs) == {"avx512": ("avx2", own)}.get(native.default_impl(),
                                                                          (native.default_impl(),) * 2), s
            continue
        if "avx512" in s.families:  # the grid i-quants: AVX2 tiles, AVX-512 VNNI prefill (test_qdot_iq_vnni.py)
            assert s.families == ("scalar", "avx2", "avx512"), s
            prefill = "avx512"  # Zen 4 too (qdot.c)
            # the planes or gather tiles; IQ4_XS's zmm decode tile (test_qdot_tiles.py runs them all)
            zmm = t == T.IQ4_XS and not native.cpu_splits_512()
            decode = "avx512" if (GRID_DECODE_512 and t in GRID_TYPES) or zmm else "avx2"
            assert (s.runs, s.decode_runs) == {"avx512": (prefill, decode)}.get(native.default_impl(),
                                                                                (native.default_impl(),) * 2), s
            assert s.verdict() == f"{t.name}: dequantize yes; packed compute yes (scalar/avx2/avx512 kernels)"
            continue
        if "avx2" in s.families:  # the code-book and ternary formats' AVX2 kernels (test_qdot_iq4_avx2.py)
            assert s.families == ("scalar", "avx2") and s.runs == ("scalar" if native.default_impl() == "scalar" else "avx2"), s
            assert s.verdict() == f"{t.name}: dequantize yes; packed compute yes (scalar/avx2 kernels)"
            continue
        assert s.families == ("scalar",) and s.runs == "scalar", s
        assert s.verdict() == f"{t.name}: dequantize yes; packed compute yes (scalar kernels)"
    q4k, q4_0 = native.type_support(T.Q4_K), native.type_support(T.Q4_0)
    assert "avx2" in q4k.families and q4_0.runs == q4_0.decode_runs == native.default_impl()
    # AVX-512 machines prefill Q4_K with its AVX2 tiles (their build for AVX-512 machines, over unpacked
    # rows), measured faster (native/qdot.c's kernel table); they decode it with its zmm decode tile
    # (test_qdot_zmm_decode.py) where 512-bit operations are whole, else with the AVX2 tiles too
    if native.default_impl() == "avx512":
        decode = "avx2" if native.cpu_splits_512() else "avx512"
        assert q4k.decode_runs == decode and q4k.runs == "avx2", q4k
    else:
        assert q4k.runs == q4k.decode_runs == native.default_impl(), q4k
    for t in (T.Q8_1, T.Q8_K, T.I8, T.F64):
        s = native.type_support(int(t))
        assert not s.dequant and not s.packed and s.runs is None
        assert s.verdict() == f"{t.name}: not supported (no dequantization, no packed kernels)"
    assert set(native.supported_types()) == set(DEQUANT_TYPES) == set(native.supported_types(packed=True))
