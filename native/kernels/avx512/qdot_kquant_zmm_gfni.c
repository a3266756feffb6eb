/*
 * qdot_kquant_zmm.c built with GFNI (names _kzgfni): each 64 codes made by one GF2P8AFFINEQB where the
 * other build shifts and ANDs, and the high bits of Q3_K, Q5_K and Q6_K selected into the code's
 * byte. qdot.c hands these out where the CPU has AVX-512 VBMI and GFNI (strata_cpu_has_avx512_vbmi).
 */
#define KZ_GFNI 1
#include "qdot_kquant_zmm.c"
