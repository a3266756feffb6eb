"""The AVX-512 family: CPU detection, the AUTO choice and its overrides, and the AVX-512 quantized
matrix kernels against their scalar twins.

Activation blocks must be byte-identical; matrix outputs may differ only by the order of the float
additions, bounded by 1e-5 * (|W| @ |x|) per output (a wrong index or sign gives errors of order
one). Where the CPU has no AVX-512 the kernel comparisons skip and the refusal is tested instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from strata import native
from strata.errors import NativeError
from strata.quant import DEQUANT_TYPES, GGMLType, block_size, random_blocks
from tests.native import test_qdot as qd

T = GGMLType
ROOT = Path(__file__).resolve().parents[2]
HAS_AVX512 = native.cpu_has_avx512()
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="CPU (or OS) without AVX-512 F/BW/VL/VNNI: "
                                                         "the AVX-512 kernels cannot run here")

# Formats with AVX-512 kernels of their own, and a row length (a few blocks, odd counts included).
FORMATS = {T.Q4_0: 96, T.Q4_1: 224, T.Q5_0: 160, T.Q5_1: 96, T.Q8_0: 160, T.MXFP4: 224, T.IQ4_NL: 160, T.Q4_K: 768,
           T.Q5_K: 512, T.Q6_K: 1280, T.F16: 45, T.BF16: 1027}
TOKENS = [1, 2, 7, 64]
# (weight scale, activation scale): ordinary; subnormal float16 scales with tiny activations;
# large both; activations whose 8-bit scale d = max|x| / 127 is a float32 subnormal.
SCALES = [(0.02, 1.0), (6e-8, 1e-20), (3e4, 1e8), (1.0, 1e-38)]


def cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def weights(t: GGMLType, n_rows: int, row_len: int, scale: float, rng) -> np.ndarray:
    elems, _ = block_size(t)
    w = random_blocks(t, n_rows * row_len // elems, rng, scale=scale)
    if t in (T.F16, T.BF16):   # random_blocks draws N(0, 1) for float formats: rescale, stay finite
        wide = native.dequantize(t, w, (n_rows, row_len)) * np.float32(min(scale, 1e4))
        w = (wide.astype(np.float16).view(np.uint8) if t == T.F16
             else (wide.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8))
    return np.ascontiguousarray(w).reshape(-1)


def activations(n_tok: int, row_len: int, scale: float, rng) -> np.ndarray:
    x = (rng.standard_normal((n_tok, row_len)) * scale).astype(np.float32)
    x[0, : min(row_len, 40)] = 0.0                     # zero blocks (d = 0)
    if n_tok > 1:
        x[1, row_len // 2] = np.float32(60 * scale)    # an outlier
    if n_tok > 2:
        x[2] = 0.0                                     # an all-zero row
    return x


def assert_close_to_scalar(t, w, n_rows, row_len, x, what):
    ref = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
    got = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
    wf = native.dequantize(t, w, (n_rows, row_len), impl="scalar").astype(np.float64)
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(wf).T)     # [T, N]
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    assert np.isfinite(ref).all() and np.isfinite(got).all(), what
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} outputs off, worst "
                           f"{float((err / np.maximum(bound, 1e-300)).max()):.3g} x the bound")


@needs_avx512
@pytest.mark.parametrize("scales", SCALES, ids=lambda s: f"w{s[0]:g}-x{s[1]:g}")
@pytest.mark.parametrize("n_tok", TOKENS)
@pytest.mark.parametrize("t", list(FORMATS), ids=lambda t: t.name)
def test_avx512_qdot_matches_scalar(t, n_tok, scales):
    rng = np.random.default_rng([int(t), n_tok, int(np.log2(scales[0]) + 200)])
    for n_rows, row_len in ((1, block_size(t)[0]), (13, FORMATS[t]), (3, 4 * FORMATS[t])):
        w = weights(t, n_rows, row_len, scales[0], rng)
        x = activations(n_tok, row_len, scales[1], rng)
        assert_close_to_scalar(t, w, n_rows, row_len, x, f"{t.name} W[{n_rows}, {row_len}] x[{n_tok}] {scales}")


@needs_avx512
@pytest.mark.parametrize("t", list(FORMATS), ids=lambda t: t.name)
def test_avx512_calls_run_the_tiles_the_table_names(t):
    """Decode (1-3 tokens) and prefill (4 and more) run the families the kernel table names for
    AVX-512 (its own, or the AVX2 tile where that measured faster): the same bytes as a call of
    that family."""
    from strata.native.qdot import kernel_family
    rng = np.random.default_rng(int(t))
    n_rows, row_len = 21, 8 * FORMATS[t]
    w = weights(t, n_rows, row_len, 0.02, rng)
    families = {phase: kernel_family(t, "avx512", decode=phase == "decode") for phase in ("decode", "prefill")}
    assert set(families.values()) <= {"avx2", "avx512"}, families
    assert kernel_family(t, "avx2", decode=True) == "avx2" and kernel_family(t, "scalar", decode=False) == "scalar"
    for n_tok in (1, 2, 3, 4, 9):
        x = activations(n_tok, row_len, 1.0, rng)
        family = families["decode" if n_tok < 4 else "prefill"]
        got = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
        assert got.tobytes() == native.qdot_rows(t, w, n_rows, row_len, x, impl=family).tobytes(), (t.name, n_tok)
    support = native.type_support(t)
    if native.default_impl() == "avx512":
        assert (support.decode_runs, support.runs) == (families["decode"], families["prefill"])


@needs_avx512
def test_avx512_own_tiles_override_the_table():
    """STRATA_AVX512_OWN_TILES=1 (for measuring the table): every AVX-512 call runs its own tiles."""
    code = ("from strata.native.qdot import kernel_family as f; "
            "print(f('Q4_K', 'avx512', True), f('Q4_K', 'avx512', False), f('Q8_0', 'avx512', True))")
    env = child_env()
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    own = subprocess.run([sys.executable, "-c", code], env={**env, "STRATA_AVX512_OWN_TILES": "1"},
                         capture_output=True, text=True, check=True)
    # Q4_K's decode: its zmm decode tile (test_qdot_zmm_decode.py) where 512-bit operations are whole
    q4_k_decode = "avx2" if native.cpu_splits_512() else "avx512"
    assert plain.stdout.split() == [q4_k_decode, "avx2", "avx2"] and own.stdout.split() == ["avx512"] * 3


def test_a_split_512_bit_datapath_is_told_by_vendor_and_family():
    """The kernel table's *_SPLIT choices (TQ1_0's decode) and the VNNI tiles' last group follow
    strata_cpu_splits_512: AMD family 19h (Zen 4) as /proc/cpuinfo tells it."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo to check against")
    fields = dict(line.split(":", 1) for line in info.read_text().splitlines()[:12] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    expected = fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"
    assert native.cpu_splits_512() == expected, fields.get("vendor_id")


@needs_avx512
@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_K], ids=lambda t: t.name)
def test_avx512_activation_blocks_are_bytes_of_scalar(t):
    rng = np.random.default_rng(int(t))
    row_len = 2048
    rows = [rng.standard_normal(row_len) * s for s in (1.0, 1e-3, 1e30, 1e-38, 3e-43, 1e-44)]
    x = np.stack(rows).astype(np.float32)
    x[0, :300] = 0.0
    x[1, 5] = -1e3
    x[2, ::3] = -x[2, ::3]
    x[3, 7] = 2.5e-43                 # d is a float32 subnormal; x / d may round past 127 and wrap
    got = native.quantize_act(t, x, impl="avx512")
    ref = native.quantize_act(t, x, impl="scalar")
    assert got.shape == ref.shape
    assert np.array_equal(got, ref), f"{t.name}: rows {np.flatnonzero((got != ref).any(axis=1)).tolist()} differ"


# ---- The qdot suite's cases (tests/native/test_qdot.py), for the AVX-512 family ----

@needs_avx512
@pytest.mark.parametrize("t", qd.ALL_TYPES, ids=lambda t: t.name)
def test_avx512_activation_quantizer_matches_numpy(t):
    qd.test_activation_quantizer_matches_numpy(t, "avx512")


@needs_avx512
@pytest.mark.parametrize("case", qd.CASES, ids=qd.CASE_IDS)
@pytest.mark.parametrize("t", qd.ALL_TYPES, ids=lambda t: t.name)
def test_avx512_qdot_within_bounds_of_float64(t, case):
    qd.test_qdot_within_bounds_of_float64(t, case, "avx512")


@needs_avx512
@pytest.mark.parametrize("case", qd.CASES, ids=qd.CASE_IDS)
@pytest.mark.parametrize("t", qd.ALL_TYPES, ids=lambda t: t.name)
def test_avx512_matches_scalar_within_twice_the_rounding_bound(t, case):
    """As test_qdot's AVX2 comparison: bit-identical where the family falls back, else within
    twice the float-rounding bound of the exact W @ A."""
    n_rows, n_blocks, n_tok = case
    rng = np.random.default_rng(int(t) * 11 + n_rows + n_tok)
    row_len = qd.row_len_of(t, n_blocks)
    w = qd.make_weights(t, n_rows, row_len, rng)
    x = qd.make_tokens(n_tok, row_len, rng)
    ys = native.qdot_rows(t, w, n_rows, row_len, x, impl="scalar")
    yv = native.qdot_rows(t, w, n_rows, row_len, x, impl="avx512")
    if not native.has_qdot_kernel(t, "avx512"):
        fallback = "avx2" if native.has_qdot_kernel(t, "avx2") else "scalar"
        yf = native.qdot_rows(t, w, n_rows, row_len, x, impl=fallback)
        assert np.array_equal(yf.view(np.uint32), yv.view(np.uint32)), f"{t.name}: {fallback} fallback differs"
        return
    _, _, a = qd.numpy_qact(t, x)
    n = (row_len if t in qd.FLOAT_TYPES else row_len // block_size(t)[0]) + 16
    tol = 2 * (n * qd.U * (np.abs(a) @ qd.magnitude(t, w, n_rows, row_len).T) + n * 2.0 ** -140)
    err = np.abs(yv.astype(np.float64) - ys)
    assert (err <= tol).all(), f"{t.name}: avx512 differs from scalar by {err.max()} (bound {tol.max()})"


@needs_avx512
def test_avx512_dequant_and_quantize_run_the_avx2_kernels():
    rng = np.random.default_rng(3)
    for t in DEQUANT_TYPES:
        elems, _ = block_size(t)
        src = random_blocks(t, 8 * (1024 // elems), rng)
        a = native.dequantize(t, src, (8, 1024), impl="avx512")
        b = native.dequantize(t, src, (8, 1024), impl="avx2")
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), t.name
    x = rng.standard_normal((4, 1024)).astype(np.float32)
    for t in (T.Q8_0, T.Q4_K, T.Q6_K):
        assert np.array_equal(native.quantize(t, x, impl="avx512"), native.quantize(t, x, impl="avx2")), t.name


@needs_avx512
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build the stand-alone check")
def test_standalone_c_check_passes(tmp_path):
    """tests/native/qdot_avx512_check.c: the same comparison in C, through strata.h alone."""
    exe = tmp_path / "qdot_avx512_check"
    sources = sorted(str(p) for p in (ROOT / "native").rglob("*.c"))
    includes = [f"-I{d}" for d in {p.parent for p in (ROOT / "native").rglob("*.h")} | {ROOT / "native"}]
    subprocess.run(["gcc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-pthread", "-ffp-contract=off",
                    *includes, *sources, str(ROOT / "tests/native/qdot_avx512_check.c"),
                    "-o", str(exe), "-lm"], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


# ---- Everywhere: detection, refusal, the AUTO choice ----

def test_detection_agrees_with_the_kernel_flags():
    flags = cpuinfo_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this system")
    wanted = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert native.cpu_has_avx512() == (wanted <= flags and native.cpu_has_avx2()), sorted(wanted & flags)
    if native.cpu_has_avx512():
        assert native.cpu_has_avx2()


@pytest.mark.skipif(HAS_AVX512, reason="this CPU has AVX-512: the request is granted")
def test_avx512_request_on_a_cpu_without_it_is_refused():
    x = np.ones((2, 64), np.float32)
    w = random_blocks(T.Q4_0, 4, np.random.default_rng(0))
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.qdot_rows(T.Q4_0, w, 2, 64, x, impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.quantize_act(T.Q4_K, np.ones((1, 256), np.float32), impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.dequantize(T.Q4_0, w, (2, 64), impl="avx512")
    with pytest.raises(NativeError, match="not available on this CPU"):
        native.quantize(T.Q4_K, np.ones((1, 256), np.float32), impl="avx512")


def child_env(**env: str) -> dict[str, str]:
    """This environment for a child Python, less the ISA caps, with the repository ahead of whatever
    PYTHONPATH already holds (where the packages live in a --target folder, the child needs both)."""
    full = {k: v for k, v in os.environ.items() if k not in ("STRATA_FORCE_SCALAR", "STRATA_FORCE_AVX2")}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    full.update(env)
    return full


def default_impl_with(**env: str) -> str:
    full = child_env(**env)
    code = "from strata import native; print(native.default_impl())"
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_default_impl_follows_detection_and_overrides():
    widest = "avx512" if native.cpu_has_avx512() else "avx2" if native.cpu_has_avx2() else "scalar"
    capped = "avx2" if native.cpu_has_avx2() else "scalar"
    assert native.default_impl() in native.IMPLS
    assert default_impl_with() == widest
    assert default_impl_with(STRATA_FORCE_AVX2="0", STRATA_FORCE_SCALAR="") == widest
    assert default_impl_with(STRATA_FORCE_AVX2="1") == capped
    assert default_impl_with(STRATA_FORCE_SCALAR="1") == "scalar"
    assert default_impl_with(STRATA_FORCE_SCALAR="1", STRATA_FORCE_AVX2="1") == "scalar"


def test_avx512_tile_kernels_of_its_own():
    own = {t for t in qd.ALL_TYPES if native.has_qdot_kernel(t, "avx512")}
    assert own == {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                   T.Q6_K}, own


def test_avx512_reports_the_avx2_dequant_kernels():
    for t in DEQUANT_TYPES:
        assert native.has_kernel(t, "avx512") == native.has_kernel(t, "avx2"), t.name
