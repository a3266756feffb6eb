"""The torch dequantizer (device tier's packed slots on CUDA) equals the native kernels bit for
bit, on the CPU device and (marked `cuda`) on CUDA."""
import numpy as np
import pytest
import torch

from strata import native
from strata.quant_torch import TORCH_DEQUANT_TYPES, dequantize_into
from strata.quant import DEQUANT_TYPES, GGMLType, block_size, random_blocks

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Formats both dequantizers read (tests/quant/test_quant_torch_iquants.py holds the others to gguf.quants).
NATIVE_TYPES = tuple(t for t in TORCH_DEQUANT_TYPES if t in DEQUANT_TYPES)
#: The CPU, and CUDA under the `cuda` mark where there is a GPU.
DEVICES = ("cpu", pytest.param("cuda", marks=(pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                   reason="needs a CUDA GPU"))))
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _check(t: GGMLType, dtype: torch.dtype, device: str, random_bytes: bool) -> None:
    rng = np.random.default_rng(int(t) * 7 + DTYPES.index(dtype))
    elems, nbytes = block_size(t)
    rows, cols = 6, 1024
    n_blocks = rows * cols // elems
    src = (rng.integers(0, 256, n_blocks * nbytes, dtype=np.uint8) if random_bytes
           else random_blocks(t, n_blocks, rng))
    ref = torch.empty(rows, cols, dtype=dtype)
    native.dequantize_into(t, src, ref)
    assert_dequant_bits(t, src, ref, device)


def assert_dequant_bits(t: GGMLType, src: np.ndarray, ref: torch.Tensor, device: str) -> None:
    """`dequantize_into` on `device` writes `ref`'s bits from `src`: NaNs in the same places, the
    other values equal bit for bit."""
    dtype = ref.dtype
    out = torch.empty(ref.shape, dtype=dtype, device=device)
    dequantize_into(t, torch.from_numpy(src).to(device), out)
    out = out.cpu()
    nan = torch.isnan(ref)
    assert torch.equal(nan, torch.isnan(out)), f"{t.name} {dtype}: NaNs in other places"
    a, b = ref.view(_BITS[dtype])[~nan], out.view(_BITS[dtype])[~nan]
    assert torch.equal(a, b), f"{t.name} {dtype}: {(a != b).sum().item()} of {a.numel()} values differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", NATIVE_TYPES, ids=lambda t: t.name)
def test_torch_dequant_equals_native_bit_for_bit(t, dtype, device):
    _check(t, dtype, device, random_bytes=False)
    if device == "cpu" and t not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        _check(t, dtype, device, random_bytes=True)  # NaN and inf scales land in the same places


def test_every_expert_format_the_native_runtime_reads_is_covered():
    """The i-quants, ternary formats and NVFP4 are dequantized natively (CPU) only so far."""
    from strata.quant import DEQUANT_TYPES, IQ_TYPES

    assert set(DEQUANT_TYPES) - set(IQ_TYPES) <= set(TORCH_DEQUANT_TYPES)


def test_errors_name_the_format_and_sizes():
    out = torch.empty(2, 256)
    with pytest.raises(ValueError, match="Q4_K: output \\[2, 256\\] needs 288 packed bytes, source holds 10"):
        dequantize_into(GGMLType.Q4_K, torch.zeros(10, dtype=torch.uint8), out)
    with pytest.raises(ValueError, match="row length 100 .* block size 256"):
        dequantize_into(GGMLType.Q4_K, torch.zeros(1000, dtype=torch.uint8), torch.empty(1, 100))
    with pytest.raises(ValueError, match="1-D uint8"):
        dequantize_into(GGMLType.Q8_0, torch.zeros(1000, dtype=torch.int8), out)
    with pytest.raises(ValueError, match="not supported"):
        dequantize_into(GGMLType.Q8_K, torch.zeros(1000, dtype=torch.uint8), out)
