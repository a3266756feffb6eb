/*
 * qdot_iq_avx2.c compiled for AVX-512 machines (the grid i-quants): names _evex, AVX-512 F/BW/VL/VNNI
 * enabled (qdot_avx2_common.h says why). qdot.c's kernel table hands these out only for
 * STRATA_IMPL_AVX512, where it measured them faster than the plain AVX2 build.
 */
#define STRATA_QDOT_EVEX 1
#include "qdot_iq_avx2.c"
