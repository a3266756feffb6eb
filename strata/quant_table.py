"""The table of quant types: one row per ggml type the native runtime reads, the one place a type's
facts live. `native/formats/gen_quant_types.py` writes the C side from it (the type ids, block structs
and format table in native/formats/quant_types.h, the kernel rows in native/kernels/qdot_table.h);
`strata.quant` and the tests read it as it is. Data only: no numpy, no files.

A row gives the block (elements, bytes, its C fields), the activation format the matrix kernels
round activations to, the dequantizer's families, the float16 scale fields, and the tiles of the
matrix kernels per family and phase. A tile is named by its kind (TILE_KINDS): the C function is
`strata_qdot_<type>_<kind>`. A family's list for a phase is tried in order; the first tile this CPU
runs (the kind's `needs`) whose condition holds (`"kind if condition"`, CONDITIONS) is the one.
Tiles after an unconditional one are reached only through STRATA_KERNEL=+kind (native/kernels/cpu.c),
for measuring the choice. The scalar family always runs `ref`, the scalar twin of every tile.
Measured figures behind each choice: benchmarks/RESULTS.md ("Kernel choice per CPU").
"""
from __future__ import annotations

from typing import NamedTuple


class TileKind(NamedTuple):
    family: str                 # what a call reports ("scalar", "avx2", "avx512")
    needs: tuple[str, ...]      # CPU features (CPU_FEATURES) it runs on
    few_tokens: bool            # a decode tile that takes any call of fewer than 8 tokens
    about: str


#: Bits of a CPU description (strata_cpu_desc.features, native/kernels/cpu.c): what a tile may need
#: (AVX2 with FMA and F16C; AVX-512 F/BW/VL/VNNI; VBMI with GFNI; AVX-VNNI), gathers at the load ports'
#: rate, and ymm gathers for the grid i-quants' AVX2 chunks (an Intel CPU without the Gather Data
#: Sampling mitigation: a choice inside those tiles, not a tile of its own).
CPU_FEATURES = ("avx2", "avx512", "vbmi_gfni", "avx_vnni", "fast_gathers", "ymm_gathers")

#: Conditions a row may put on a tile (measured: where it is the faster one), read from the CPU
#: description: whole_512, 512-bit operations not split in two halves (all but AMD family 19h, Zen 4);
#: fast_gathers, gathers at the load ports' rate (no Gather Data Sampling mitigation, not Zen 4);
#: zen5, AMD family 1Ah.
CONDITIONS = ("whole_512", "fast_gathers", "zen5")

TILE_KINDS: dict[str, TileKind] = {
    "ref": TileKind("scalar", (), False, "scalar twin (qdot_ref.c, qdot_iq.c): the definition"),
    "avx2": TileKind("avx2", ("avx2",), False, "AVX2 tiles (avx2/)"),
    "avxvnni": TileKind("avx2", ("avx2", "avx_vnni"), False, "AVX2 tiles built with AVX-VNNI (avx2/qdot_*avxvnni.c)"),
    "evex": TileKind("avx2", ("avx512",), False, "the AVX2 tiles built for AVX-512 machines (avx512/qdot_*_evex.c)"),
    "avx512": TileKind("avx512", ("avx512",), False, "AVX-512's own tiles (avx512/)"),
    "kz": TileKind("avx512", ("avx512",), True, "zmm decode tiles, codes in element order (qdot_kquant_zmm.c)"),
    "kzgfni": TileKind("avx512", ("avx512", "vbmi_gfni"), True, "the same built with GFNI (qdot_kquant_zmm_gfni.c)"),
    "zmm": TileKind("avx512", ("avx512",), True,
                    "zmm decode tiles over activations re-laid per call (qdot_iq4_xs_avx512.c, qdot_nvfp4_avx512.c)"),
    "vbmi": TileKind("avx512", ("avx512", "vbmi_gfni"), True, "gather decode tiles of the grid i-quants (qdot_iq_vbmi.c)"),
    "planes": TileKind("avx512", ("avx512", "vbmi_gfni"), True, "decode tiles by planes (qdot_iq_planes.c)"),
}


class Phases(NamedTuple):
    """A family's tiles for decode (calls of fewer than 4 tokens) and prefill, in order of choice."""
    decode: tuple[str, ...]
    prefill: tuple[str, ...]


def both(*tiles: str) -> Phases:
    return Phases(tiles, tiles)


class QuantType(NamedTuple):
    name: str                   # the GGML name; the C names use it in lower case
    id: int                     # gguf.GGMLQuantizationType
    block_elems: int
    block_bytes: int
    layout: str | None          # the block's C fields (packed); None for float formats
    act: str                    # activation format of the matrix kernels: Q8 (32), Q8K (256), F32
    group: str                  # float, q (32-value formats), k (K-quants), iq (i-quants, ternary, NVFP4)
    dequant: tuple[str, ...]    # dequantizer families with a kernel of their own
    scales: tuple[int, ...]     # byte offsets of the float16 scale fields (d, m, dmin) in a block
    scale: float                # d that gives random codes elements of ~0.03 (test data)
    avx2: Phases
    avx512: Phases
    min_codes: tuple[int, int] | None = None   # byte range of the codes of a format with a min


FLOATS = both("avx2")
EVEX = both("evex")
#: The zmm decode tiles where 512-bit operations are whole (the GFNI build where the CPU has it)
KZ = ("kzgfni if whole_512", "kz if whole_512")
#: The grid i-quants: decode by planes, else by gathers, else the AVX2 build; prefill by VNNI tiles;
#: on AVX2 CPUs with AVX-VNNI the AVX2 tiles built with it.
GRID_AVX2 = both("avxvnni", "avx2")
GRID = Phases(("planes if whole_512", "vbmi if fast_gathers", "evex", "avx512"), ("avx512",))
#: IQ1's planes tiles gather their codes: where gathers are fast only
GRID_IQ1 = Phases(("planes if whole_512 and fast_gathers", "vbmi if fast_gathers", "evex", "avx512"), ("avx512",))

TYPES: tuple[QuantType, ...] = (
    QuantType("F32", 0, 1, 4, None, "F32", "float", ("ref",), (), 1.0, FLOATS, EVEX),
    QuantType("F16", 1, 1, 2, None, "F32", "float", ("ref", "avx2"), (), 1.0, FLOATS, both("avx512")),
    QuantType("BF16", 30, 1, 2, None, "F32", "float", ("ref", "avx2"), (), 1.0, FLOATS, both("avx512")),
    QuantType("Q4_0", 2, 32, 18, "uint16_t d; uint8_t qs[16];", "Q8", "q", ("ref", "avx2"), (0,), 0.01, FLOATS,
              Phases(("evex if zen5", "avx512"), ("avx512",))),
    QuantType("Q4_1", 3, 32, 20, "uint16_t d, m; uint8_t qs[16];", "Q8", "q", ("ref",), (0, 2), 0.01, FLOATS,
              both("avx512"), min_codes=(4, 20)),
    QuantType("Q5_0", 6, 32, 22, "uint16_t d; uint8_t qh[4]; uint8_t qs[16];", "Q8", "q", ("ref",), (0,), 0.01,
              FLOATS, both("avx512")),
    QuantType("Q5_1", 7, 32, 24, "uint16_t d, m; uint8_t qh[4]; uint8_t qs[16];", "Q8", "q", ("ref",), (0, 2), 0.01,
              FLOATS, both("avx512"), min_codes=(4, 24)),
    QuantType("Q8_0", 8, 32, 34, "uint16_t d; int8_t qs[32];", "Q8", "q", ("ref", "avx2"), (0,), 0.01, FLOATS,
              Phases(("evex", "avx512"), ("avx512",))),
    QuantType("Q2_K", 10, 256, 84, "uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin;", "Q8K", "k", ("ref",),
              (80, 82), 0.01, FLOATS, Phases((*KZ, "evex", "avx512"), ("avx512",)), min_codes=(16, 80)),
    QuantType("Q3_K", 11, 256, 110, "uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d;", "Q8K", "k",
              ("ref",), (108,), 0.01, FLOATS, Phases((*KZ, "evex", "avx512"), ("avx512",))),
    QuantType("Q4_K", 12, 256, 144, "uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128];", "Q8K", "k",
              ("ref", "avx2"), (0, 2), 0.01, FLOATS, Phases((*KZ, "evex", "avx512"), ("evex", "avx512")),
              min_codes=(16, 144)),
    QuantType("Q5_K", 13, 256, 176, "uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128];", "Q8K",
              "k", ("ref", "avx2"), (0, 2), 0.01, FLOATS, Phases((*KZ, "evex", "avx512"), ("evex", "avx512")),
              min_codes=(16, 176)),
    QuantType("Q6_K", 14, 256, 210, "uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d;", "Q8K", "k",
              ("ref", "avx2"), (208,), 0.01, FLOATS, Phases((*KZ, "evex", "avx512"), ("avx512",))),
    QuantType("MXFP4", 39, 32, 17, "uint8_t e; uint8_t qs[16];", "Q8", "q", ("ref", "avx2"), (), 0.01, FLOATS,
              both("avx512")),
    QuantType("IQ2_XXS", 16, 256, 66, "uint16_t d; uint8_t qs[64];", "Q8K", "iq", ("ref",), (0,), 0.0015,
              GRID_AVX2, GRID),
    QuantType("IQ2_XS", 17, 256, 74, "uint16_t d; uint8_t qs[64]; uint8_t scales[8];", "Q8K", "iq", ("ref",), (0,),
              0.0015, GRID_AVX2, GRID),
    QuantType("IQ2_S", 22, 256, 82,
              "uint16_t d; uint8_t qs[32]; uint8_t signs[32]; uint8_t qh[8]; uint8_t scales[8];", "Q8K", "iq",
              ("ref",), (0,), 0.0015, GRID_AVX2, GRID),
    QuantType("IQ3_XXS", 18, 256, 98, "uint16_t d; uint8_t qs[64]; uint8_t aux[32];", "Q8K", "iq", ("ref",), (0,),
              0.0005, GRID_AVX2, GRID),
    QuantType("IQ3_S", 21, 256, 110,
              "uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4];", "Q8K", "iq",
              ("ref",), (0,), 0.0005, GRID_AVX2, GRID),
    QuantType("IQ1_S", 19, 256, 50, "uint16_t d; uint8_t qs[32]; uint8_t qh[16];", "Q8K", "iq", ("ref",), (0,),
              0.01, GRID_AVX2, GRID_IQ1),
    QuantType("IQ1_M", 29, 256, 56, "uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8];", "Q8K", "iq", ("ref",), (),
              0.01, GRID_AVX2, GRID_IQ1),
    QuantType("IQ4_NL", 20, 32, 18, "uint16_t d; uint8_t qs[16];", "Q8", "iq", ("ref",), (0,), 0.001, FLOATS,
              both("avx512")),
    QuantType("IQ4_XS", 23, 256, 136, "uint16_t d, scales_h; uint8_t scales_l[4]; uint8_t qs[128];", "Q8K", "iq",
              ("ref",), (0,), 0.0001, FLOATS, Phases(("zmm if whole_512", "evex", "avx512"), ("avx512",))),
    QuantType("TQ1_0", 34, 256, 54, "uint8_t qs[48]; uint8_t qh[4]; uint16_t d;", "Q8K", "iq", ("ref",), (52,), 0.05,
              Phases(("avxvnni", "avx2"), ("avx2",)), Phases(("avx512 if whole_512", "evex"), ("evex", "avx512"))),
    QuantType("TQ2_0", 35, 256, 66, "uint8_t qs[64]; uint16_t d;", "Q8K", "iq", ("ref",), (64,), 0.05, FLOATS,
              Phases((*KZ, "evex"), ("evex",))),
    QuantType("NVFP4", 40, 64, 36, "uint8_t d[4]; uint8_t qs[32];", "Q8", "iq", ("ref",), (), 0.005, FLOATS,
              Phases(("zmm if whole_512", "evex"), ("evex",))),
)

BY_NAME: dict[str, QuantType] = {row.name: row for row in TYPES}


def parse_tile(entry: str) -> tuple[str, tuple[str, ...]]:
    """('planes', ('whole_512', 'fast_gathers')) from 'planes if whole_512 and fast_gathers'."""
    kind, _, cond = entry.partition(" if ")
    return kind, tuple(c.strip() for c in cond.split(" and ")) if cond else ()


def tiles_of(row: QuantType, family: str, phase: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The (kind, conditions) a call of `family` ('scalar', 'avx2', 'avx512') may run for `phase`
    ('decode', 'prefill'), in order of choice."""
    if family == "scalar":
        return (("ref", ()),)
    tiles = tuple(parse_tile(e) for e in getattr(getattr(row, family), phase))
    if family == "avx512" and "evex" not in (k for k, _ in tiles):
        tiles += (("evex", ()),)   # every type's AVX2 source is built for AVX-512 machines too
    return tiles


def kinds_of(row: QuantType) -> tuple[str, ...]:
    """Every tile kind the row names (ref first), each once."""
    seen = ["ref"]
    for family in ("avx2", "avx512"):
        for phase in ("decode", "prefill"):
            seen += [k for k, _ in tiles_of(row, family, phase) if k not in seen]
    return tuple(seen)


__all__ = ["BY_NAME", "CONDITIONS", "CPU_FEATURES", "Phases", "QuantType", "TILE_KINDS", "TYPES", "TileKind",
           "kinds_of", "parse_tile", "tiles_of"]
