/*
 * qdot_iq_avx2.c compiled for AVX2 CPUs with AVX-VNNI (the grid i-quants): names _avxvnni, AVX-VNNI
 * enabled, so that each chunk's products take their sub-block weights with one VEX-encoded VPDPWSSD
 * instead of a VPMADDWD and an add (madd_acc, qdot_avx2_common.h). These tiles are bound by their
 * vector instructions, not by memory, and the integer sums are exact either way: the same bytes as
 * the AVX2 build. qdot.c's kernel table hands them out for STRATA_IMPL_AVX2 where
 * strata_cpu_avx_vnni() says the CPU has it (Intel's Alder Lake and later client cores).
 */
#include "qdot.h"

#if STRATA_CC_AVX_VNNI
#define STRATA_QDOT_AVXVNNI 1
#include "qdot_iq_avx2.c"
#else /* a compiler without AVX-VNNI: the names exist so the library links; strata_cpu_avx_vnni() says 0 */
#define IQ_AVXVNNI_FALLBACK(name)                                                                          \
    void strata_qdot_##name##_avxvnni(int64_t k, const uint8_t *restrict w, int64_t wrb, int64_t n_rows,    \
                                      const uint8_t *restrict a, int64_t arb, int64_t n_tok,                \
                                      float *restrict y, int64_t ys) {                                      \
        strata_qdot_##name##_ref(k, w, wrb, n_rows, a, arb, n_tok, y, ys);                                  \
    }
IQ_AVXVNNI_FALLBACK(iq2_xxs) IQ_AVXVNNI_FALLBACK(iq2_xs) IQ_AVXVNNI_FALLBACK(iq2_s) IQ_AVXVNNI_FALLBACK(iq3_xxs)
IQ_AVXVNNI_FALLBACK(iq3_s) IQ_AVXVNNI_FALLBACK(iq1_s) IQ_AVXVNNI_FALLBACK(iq1_m)
#endif
