"""GGML block formats: names, block geometry and byte sizes. Knows no files and no torch.

Block geometry comes from gguf-py's table (`gguf.GGML_QUANT_SIZES`) so there is one source of
truth; the types Strata's native runtime reads, and their facts, come from the table of quant types
(`strata.quant_table`).
"""
from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.quant_table import TYPES

GGMLType = GGMLQuantizationType

#: i-quants, ternary formats and NVFP4 (scalar dequantization; scalar and AVX2 packed products).
IQ_TYPES: tuple[GGMLType, ...] = tuple(GGMLType[row.name] for row in TYPES if row.group == "iq")

#: Formats the native runtime dequantizes (scalar kernels for all, AVX2 for some): every row of the table.
DEQUANT_TYPES: tuple[GGMLType, ...] = tuple(GGMLType[row.name] for row in TYPES)


def ggml_type(value: int | str | GGMLType) -> GGMLType:
    """Normalise a ggml type given as enum, id or name ('q4_k', 'Q4_K')."""
    if isinstance(value, GGMLType):
        return value
    if isinstance(value, str):
        try:
            return GGMLType[value.upper()]
        except KeyError:
            raise ValueError(f"unknown ggml type name {value!r}") from None
    try:
        return GGMLType(int(value))
    except ValueError:
        raise ValueError(f"unknown ggml type id {value!r}") from None


def block_size(t: int | str | GGMLType) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[ggml_type(t)]


def row_bytes(t: int | str | GGMLType, n_elems: int) -> int:
    """Bytes of `n_elems` elements of type `t`; `n_elems` must be a whole number of blocks."""
    t = ggml_type(t)
    elems, nbytes = GGML_QUANT_SIZES[t]
    if n_elems % elems:
        raise ValueError(f"{t.name}: {n_elems} elements is not a multiple of the block size {elems}")
    return n_elems // elems * nbytes


def tensor_bytes(t: int | str | GGMLType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor with ggml `shape` (fastest dimension first) in type `t`."""
    n_rows = 1
    for d in shape[1:]:
        n_rows *= int(d)
    return row_bytes(t, int(shape[0]) if shape else 1) * n_rows


#: Byte offsets of the float16 scale fields (d, m, dmin) inside one block of each quantized type.
HALF_SCALE_OFFSETS: dict[GGMLType, tuple[int, ...]] = {GGMLType[row.name]: row.scales for row in TYPES if row.scales}
#: IQ1_M keeps its float16 d in the top nibbles of the four little-endian u16 words at these bytes.
IQ1_M_SCALE_WORDS = 48
#: NVFP4's four UE4M3 sub-block scales (bytes 0-3).
NVFP4_SCALE_BYTES = 4


def set_iq1_m_half(blocks, halves) -> None:
    """Write float16 `halves` [N] (as uint16) into IQ1_M blocks [N, 56] in place: nibble m of the half
    goes to the top nibble of scale word m; the 3-bit scales below stay as they are."""
    import numpy as np

    h = np.asarray(halves).view(np.uint16).astype(np.uint16)
    words = np.ascontiguousarray(blocks[:, IQ1_M_SCALE_WORDS:IQ1_M_SCALE_WORDS + 8]).view("<u2")  # [N, 4]
    for m in range(4):
        words[:, m] = (words[:, m] & 0x0FFF) | (((h >> (4 * m)) & 0xF) << 12)
    blocks[:, IQ1_M_SCALE_WORDS:IQ1_M_SCALE_WORDS + 8] = words.view(np.uint8)


def random_blocks(t: int | str | GGMLType, n_blocks: int, rng, scale: float = 0.01):
    """Random, well-formed packed blocks of type `t` (finite scales of magnitude ~`scale`).

    Quantized codes are uniform random bytes; scale fields are set to random float16 values so
    the data decodes to finite numbers, as a real tensor would. Returns a uint8 numpy array.
    """
    import numpy as np

    t = ggml_type(t)
    elems, nbytes = block_size(t)
    n = n_blocks * elems
    if t == GGMLType.F32:
        return rng.standard_normal(n, dtype=np.float32).view(np.uint8)
    if t == GGMLType.F16:
        return rng.standard_normal(n, dtype=np.float32).astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16:
        return (rng.standard_normal(n, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    if t == GGMLType.MXFP4:
        blocks[:, 0] = rng.integers(120, 128, size=n_blocks, dtype=np.uint8)  # 2**-7 .. 2**0 (E8M0)
    if t == GGMLType.NVFP4:  # UE4M3 scales near `scale` (their value is halved: exponent of 2 * scale)
        e = np.clip(round(np.log2(2 * scale)) + 7 + rng.integers(-1, 2, size=(n_blocks, 4)), 1, 14)
        blocks[:, :NVFP4_SCALE_BYTES] = (e << 3 | rng.integers(0, 8, size=(n_blocks, 4))).astype(np.uint8)
    def halves():
        return (rng.random(n_blocks, dtype=np.float32) * scale + scale / 16).astype(np.float16)

    if t == GGMLType.IQ1_M:
        set_iq1_m_half(blocks, halves())
    for off in HALF_SCALE_OFFSETS.get(t, ()):
        blocks[:, off:off + 2] = halves().view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)
