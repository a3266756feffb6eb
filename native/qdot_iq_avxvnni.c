/*
 * qdot_iq_avx2.c compiled for AVX2 CPUs with AVX-VNNI (the grid i-quants): names _avxvnni, AVX-VNNI
 * enabled, so that each chunk's products take their sub-block weights with one VEX-encoded VPDPWSSD
 * instead of a VPMADDWD and an add (madd_acc, qdot_avx2_common.h). These tiles are bound by their
 * vector instructions, not by memory, and the integer sums are exact either way: the same bytes as
 * the AVX2 build. qdot.c's kernel table hands them out for STRATA_IMPL_AVX2 where
 * strata_cpu_avx_vnni() says the CPU has it (Intel's Alder Lake and later client cores).
 */
#define STRATA_QDOT_AVXVNNI 1
#include "qdot_iq_avx2.c"
