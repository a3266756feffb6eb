/*
 * qdot_iq4_avx2.c compiled for AVX-512 machines (IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, NVFP4): names _evex, AVX-512 F/BW/VL/VNNI
 * enabled (qdot_avx2_common.h says why). qdot.c's kernel table hands these out only for
 * STRATA_IMPL_AVX512, where it measured them faster than the plain AVX2 build.
 */
#define STRATA_QDOT_EVEX 1
#include "qdot_iq4_avx2.c"
