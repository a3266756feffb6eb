/*
 * qdot_k2_avx512.c built with GFNI (names _k2gfni): each 64 codes made by one GF2P8AFFINEQB where the
 * other build shifts and ANDs, and Q3_K's third bit moved in by one select. qdot.c hands these out
 * where the CPU has AVX-512 VBMI and GFNI (strata_cpu_has_avx512_vbmi).
 */
#define K2_GFNI 1
#include "qdot_k2_avx512.c"
