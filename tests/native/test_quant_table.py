"""The table of quant types (strata/quant_table.py) is the one place a type's facts live: the C side
generated from it is not stale, its facts agree with gguf-py's and with the built library, and every
list the Python side keeps is read from it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gguf import GGML_QUANT_SIZES

from strata import native
from strata.native._lib import ffi, lib
from strata.quant import DEQUANT_TYPES, HALF_SCALE_OFFSETS, IQ_TYPES, GGMLType
from strata.quant_table import CONDITIONS, TILE_KINDS, TYPES, kinds_of, tiles_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_c_side_is_not_stale():
    """native/formats/quant_types.h, native/kernels/qdot_table.h and qdot_table.c are what
    native/formats/gen_quant_types.py makes from the table."""
    out = subprocess.run([sys.executable, str(ROOT / "native" / "formats" / "gen_quant_types.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_rows_agree_with_gguf_and_the_library():
    elems, nbytes = ffi.new("int64_t *"), ffi.new("int64_t *")
    for row in TYPES:
        t = GGMLType[row.name]
        assert int(t) == row.id and GGML_QUANT_SIZES[t] == (row.block_elems, row.block_bytes), row.name
        assert lib.strata_dequant_block_size(row.id, elems, nbytes) == lib.STRATA_OK, row.name
        assert (elems[0], nbytes[0]) == (row.block_elems, row.block_bytes), row.name
        assert bool(lib.strata_dequant_has_kernel(row.id, lib.STRATA_IMPL_AVX2)) == ("avx2" in row.dequant), row.name


def test_every_row_is_well_formed():
    """Each row names its scalar twin and an AVX2 tile, known kinds and conditions, and tiles of a
    family in that family's lists (the AVX2 build for AVX-512 machines may serve an AVX-512 call)."""
    for row in TYPES:
        kinds = kinds_of(row)
        assert kinds[0] == "ref" and "avx2" in kinds and set(kinds) <= set(TILE_KINDS), row.name
        for family in ("avx2", "avx512"):
            for phase in ("decode", "prefill"):
                tiles = tiles_of(row, family, phase)
                assert tiles and not tiles[-1][1], (row.name, family, phase, "ends without a condition")
                for kind, when in tiles:
                    assert set(when) <= set(CONDITIONS), (row.name, kind, when)
                    assert TILE_KINDS[kind].family == family or kind == "evex", (row.name, family, kind)


def test_the_python_lists_are_the_tables():
    assert DEQUANT_TYPES == tuple(GGMLType[r.name] for r in TYPES)
    assert set(IQ_TYPES) == {GGMLType[r.name] for r in TYPES if r.group == "iq"}
    assert HALF_SCALE_OFFSETS == {GGMLType[r.name]: r.scales for r in TYPES if r.scales}
    assert set(native.supported_types(packed=True)) == set(DEQUANT_TYPES)
