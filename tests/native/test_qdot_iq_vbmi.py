"""Names other test modules import from here (tests/native/test_dequant_iquants.py); the tests themselves
are in test_qdot_tiles.py and test_qdot_choice.py. Remove once it asks native.qdot.select instead."""
from strata import native
from strata.quant import GGMLType as T

#: The types with a gather decode tile (kind "vbmi" of the table).
VBMI_TYPES = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)
#: The grid i-quants decode with tiles of the AVX-512 family (planes or gathers) here.
HAS_TILES = native.cpu_has_avx512() and native.qdot.kernel_family(T.IQ2_XXS, "avx512", True) == "avx512"
