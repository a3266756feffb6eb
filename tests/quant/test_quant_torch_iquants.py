"""The torch dequantizer reads the i-quants, the ternary formats and NVFP4 bit for bit as
gguf.quants does (the numeric reference), on the CPU device and (marked `cuda`) on CUDA."""
import numpy as np
import pytest
import torch
from gguf import quants as gguf_quants

from strata.quant_torch import TORCH_DEQUANT_TYPES, dequantize_into
from strata.quant import GGMLType as T
from strata.quant import block_size, random_blocks
from tests.quant.test_quant_torch import DEVICES, DTYPES, assert_dequant_bits

FORMATS = (T.IQ4_NL, T.IQ4_XS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M,
           T.TQ1_0, T.TQ2_0, T.NVFP4)


def _blocks(t: T, n_blocks: int, rng: np.random.Generator, random_bytes: bool) -> np.ndarray:
    if random_bytes:  # NaN, inf and subnormal scales included
        return rng.integers(0, 256, n_blocks * block_size(t)[1], dtype=np.uint8)
    src = random_blocks(t, n_blocks, rng).reshape(n_blocks, -1)
    if t == T.IQ1_M:  # d's top exponent bit is bit 14 of the last scale word: clear keeps d finite
        src[:, 55] &= 0xBF
    return src.reshape(-1)


def _check(t: T, dtype: torch.dtype, device: str, random_bytes: bool) -> None:
    rng = np.random.default_rng(int(t) * 7 + DTYPES.index(dtype) + 100 * random_bytes)
    elems, _ = block_size(t)
    rows, cols = 6, 1024
    src = _blocks(t, rows * cols // elems, rng, random_bytes)
    with np.errstate(all="ignore"):
        ref = torch.from_numpy(gguf_quants.dequantize(src, t).reshape(rows, cols)).to(dtype)
    if not random_bytes:
        assert torch.isfinite(ref).all() and (ref != 0).any(), f"{t.name}: fixture decodes to inf/NaN or zeros"
    assert_dequant_bits(t, src, ref, device)


def test_every_format_gguf_py_dequantizes_is_covered():
    assert set(FORMATS) <= set(TORCH_DEQUANT_TYPES)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", FORMATS, ids=lambda t: t.name)
def test_torch_dequant_equals_gguf_py_bit_for_bit(t, dtype, device):
    _check(t, dtype, device, random_bytes=False)
    _check(t, dtype, device, random_bytes=True)  # NaN and inf scales land in the same places


def _iq1_m_block(delta_bits: int) -> np.ndarray:
    """One IQ1_M block: d = 1.0, every 3-bit scale 0 (dl = d), grid index 0 (all -1)."""
    block = np.zeros(56, dtype=np.uint8)
    words = np.array([(0x3C00 >> (4 * m) & 0xF) << 12 for m in range(4)], dtype="<u2")
    block[48:56] = words.view(np.uint8)
    block[32:48] = delta_bits
    return block


def test_iq1_m_delta_bit_set_shifts_the_lattice_down():
    out = torch.empty(256)
    dequantize_into(T.IQ1_M, torch.from_numpy(_iq1_m_block(0x00)), out)
    assert torch.all(out == -0.875)  # -1 + 1/8
    dequantize_into(T.IQ1_M, torch.from_numpy(_iq1_m_block(0x88)), out)
    assert torch.all(out == -1.125)  # -1 - 1/8


def test_nvfp4_scales_are_ue4m3_per_16_elements():
    block = np.zeros(36, dtype=np.uint8)
    block[0:4] = [0x38, 0x40, 0x7F, 0x00]  # UE4M3 1.0, 2.0, and the two encodings of zero
    block[4:36] = 0x97  # low nibble 7 (E2M1 6.0), high nibble 9 (E2M1 -0.5)
    out = torch.empty(64)
    dequantize_into(T.NVFP4, torch.from_numpy(block), out)
    expect = torch.tensor([6.0] * 8 + [-0.5] * 8 + [12.0] * 8 + [-1.0] * 8 + [0.0] * 32)
    assert torch.equal(out, expect)


@pytest.mark.parametrize("t", (T.Q8_K, T.Q8_1), ids=lambda t: t.name)
def test_a_format_without_a_kernel_is_refused_by_name(t):
    elems, nbytes = block_size(t)
    with pytest.raises(ValueError, match=f"torch dequantization of {t.name} is not supported .*IQ1_M"):
        dequantize_into(t, torch.zeros(nbytes, dtype=torch.uint8), torch.empty(elems))

